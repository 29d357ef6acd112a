"""One engine of benchmarks/bench_vllm_lora.py, run with the vLLM interpreter in a fresh process: ``merged``
(built on the merged weights, synced by reload) or ``native`` (built on the base weights with vLLM's LoRA,
synced by a new adapter request). Writes its numbers, or the stage it failed at, to ``--out``.

    .venv-vllm/bin/python benchmarks/_vllm_lora_engine.py --kind merged --work FOLDER --out merged.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from _vllm_lora_common import KV_CACHE_BYTES, RANK, REF_TOKENS, TOP_LOGPROBS, loadavg, median


def _last_line(err: Exception) -> str:
    lines = [line for line in traceback.format_exc().strip().splitlines() if line.strip()]
    return lines[-1] if lines else repr(err)


class _Engine:
    """The engine of ``kind`` built on the prepared folders of ``work``, and the requests the benchmark sends."""

    def __init__(self, kind: str, work: Path, seed: int):
        from vllm import LLM, SamplingParams

        self.SamplingParams = SamplingParams
        self.work, self.seed = work, seed
        self.meta = json.loads((work / "prepared.json").read_text())
        self.prompts = [{"prompt_token_ids": ids} for ids in self.meta["prompt_ids"]]
        self.native = kind == "native"
        self.version = 0
        options = dict(
            dtype="bfloat16",
            max_model_len=self.meta["max_model_len"],
            seed=seed,
            enforce_eager=True,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=0.3,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        if self.native:
            options.update(enable_lora=True, max_lora_rank=RANK, max_loras=1)
        start = time.perf_counter()
        self.llm = LLM(model=str(work / ("base" if self.native else "merged")), **options)
        self.build_s = time.perf_counter() - start

    def new_adapter(self):
        from vllm.lora.request import LoRARequest

        self.version += 1
        # LoRARequest compares by name: a new update needs a new name as well as a new id.
        return LoRARequest(f"tepo-update-{self.version}", self.version, str(self.work / "adapter"))

    def tiny_generate(self, request) -> float:
        """Seconds of a 1-token generate of one prompt, the prefix cache reset first."""
        tiny = self.SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        self.llm.reset_prefix_cache()
        start = time.perf_counter()
        self.llm.generate(self.prompts[:1], tiny, use_tqdm=False, lora_request=request)
        return time.perf_counter() - start

    def sync(self, current):
        """One sync, what every update costs the engine: ``(seconds, its parts, the adapter now)``."""
        if self.native:
            current = self.new_adapter()
            first = self.tiny_generate(current)  # loads and activates the new adapter
            again = self.tiny_generate(current)
            return first - again, {"first_generate_s": first, "second_generate_s": again}, current
        start = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.work / "merged")})
        self.llm.reset_prefix_cache()
        reload = time.perf_counter() - start
        first = self.tiny_generate(None)
        again = self.tiny_generate(None)
        parts = {"reload_s": reload, "first_generate_s": first, "second_generate_s": again}
        return reload + first - again, parts, current

    def explicit_sync(self) -> tuple[dict, object]:
        """One native sync split into ``add_lora`` (load into vLLM's CPU cache) and activation."""
        current = self.new_adapter()
        start = time.perf_counter()
        added = self.llm.llm_engine.add_lora(current)
        add_s = time.perf_counter() - start
        first = self.tiny_generate(current)
        again = self.tiny_generate(current)
        split = {
            "add_lora_returned": bool(added),
            "add_lora_s": add_s,
            "activation_s": first - again,
            "total_s": add_s + first - again,
        }
        return split, current

    def workload(self, request, rep: int) -> dict:
        """The training-shaped generation: 4 prompts x 8 samples, 64 new tokens at most, log-probs returned."""
        params = [
            self.SamplingParams(
                n=8,
                max_tokens=64,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                min_p=0.0,
                seed=self.seed + 1000 * rep + i,
                stop_token_ids=self.meta["eos_token_ids"],
                ignore_eos=False,
                logprobs=0,
                detokenize=False,
                skip_special_tokens=False,
            )
            for i in range(len(self.prompts))
        ]
        self.llm.reset_prefix_cache()
        start = time.perf_counter()
        outputs = self.llm.generate(self.prompts, params, use_tqdm=False, lora_request=request)
        seconds = time.perf_counter() - start
        tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        return {"seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds}

    def score(self, request) -> list[list[float | None]]:
        """Teacher-forced log-probs of the float32 references' tokens, one 1-token request per position: the
        next token's log-prob among the top 20 (temperature 1, top_p 1, no top-k: the processed log-probs are
        the raw log-softmax). prompt_logprobs would score a sequence in one request, but with a LoRA request it
        fails on this build (probed last). Unseeded: a seeded request split by chunked prefill fails on this
        build ("CPU Generator does not use offset")."""
        score_params = self.SamplingParams(
            max_tokens=1, temperature=1.0, top_p=1.0, top_k=0, logprobs=TOP_LOGPROBS, detokenize=False
        )
        seqs, requests, targets = self.meta["sequences"], [], []
        for i, s in enumerate(seqs):
            ids = s["prompt"] + s["completion"]
            for j in range(len(s["prompt"]), len(ids)):
                requests.append({"prompt_token_ids": ids[:j]})
                targets.append((i, ids[j]))
        self.llm.reset_prefix_cache()
        outputs = self.llm.generate(requests, score_params, use_tqdm=False, lora_request=request)
        scores: list[list[float | None]] = [[] for _ in seqs]
        for (i, target), o in zip(targets, outputs):
            step = o.outputs[0].logprobs[0]
            scores[i].append(float(step[target].logprob) if target in step else None)
        return scores

    def greedy(self, request) -> list[list[int]]:
        params = self.SamplingParams(
            max_tokens=REF_TOKENS,
            temperature=0.0,
            stop_token_ids=self.meta["eos_token_ids"],
            detokenize=False,
        )
        self.llm.reset_prefix_cache()
        outputs = self.llm.generate(self.prompts, params, use_tqdm=False, lora_request=request)
        return [list(o.outputs[0].token_ids) for o in outputs]

    def probe_prompt_logprobs(self, sequences: list[dict], lora_request) -> str:
        """ "ok", or the last line of the error, for one generate with ``prompt_logprobs=0`` over ``sequences``."""
        try:
            self.llm.generate(
                [{"prompt_token_ids": s["prompt"] + s["completion"]} for s in sequences],
                self.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False),
                use_tqdm=False,
                lora_request=lora_request,
            )
            return "ok"
        except Exception as err:
            return _last_line(err)


def _measure(engine: _Engine, result: dict, stages: list[str], syncs: int, repeats: int) -> None:
    """Every measurement of one engine into ``result``; ``stages`` ends with the one running (for a failure)."""
    native = engine.native
    current = engine.new_adapter() if native else None
    stages.append("first generate with the adapter" if native else "first generate")
    result["first_generate_s"] = engine.tiny_generate(current)  # warm-up (first load of the adapter, if any)
    engine.tiny_generate(current)
    stages.append("sync")
    sync_s, parts = [], []
    for _ in range(syncs):
        seconds, part, current = engine.sync(current)
        sync_s.append(seconds)
        parts.append(part)
    result.update(sync_s=median(sync_s), sync_all_s=sync_s, sync_parts=parts)
    if native:
        result["explicit_sync"], current = engine.explicit_sync()
    stages.append("generation")
    runs = [engine.workload(current, rep) for rep in range(repeats)]
    result.update(generation=runs, tok_s=median([r["tok_s"] for r in runs]))
    if native:
        stages.append("generation without adapter")
        result["generation_no_adapter"] = engine.workload(None, 0)
    stages.append("correctness")
    start = time.perf_counter()
    result.update(scores=engine.score(current), greedy=engine.greedy(current))
    if native:
        result.update(scores_no_adapter=engine.score(None), greedy_no_adapter=engine.greedy(None))
    result["correctness_s"] = time.perf_counter() - start
    # Last, as it may leave the engine unusable: does prompt_logprobs work (with the adapter, if any) for one
    # request alone and for the 4 sequences in one batch?
    stages.append("prompt_logprobs probe")
    sequences = engine.meta["sequences"]
    result["prompt_logprobs"] = {
        "1 request": engine.probe_prompt_logprobs(sequences[:1], current),
        "4 requests": engine.probe_prompt_logprobs(sequences, current),
    }
    stages.append("done")


def run_engine(kind: str, work: Path, out: Path, syncs: int, repeats: int, seed: int) -> int:
    result: dict = {"kind": kind, "loadavg_start": loadavg()}
    stages = ["import"]
    try:
        import vllm

        result["vllm"] = vllm.__version__
        stages.append("build")
        engine = _Engine(kind, work, seed)
        result["build_s"] = engine.build_s
        _measure(engine, result, stages, syncs, repeats)
    except Exception as err:
        result["error"] = {"stage": stages[-1], "line": _last_line(err), "traceback": traceback.format_exc()}
    result["loadavg_end"] = loadavg()
    out.write_text(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("merged", "native"), required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    return run_engine(args.kind, args.work, args.out, args.syncs, args.repeats, args.seed)


if __name__ == "__main__":  # vLLM may spawn workers: keep everything under this guard
    sys.exit(main())
