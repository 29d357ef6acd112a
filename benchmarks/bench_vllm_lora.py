"""vLLM rollouts of a LoRA policy: merged-weight sync (what tepo does) against vLLM's own LoRA serving, side by side.

After every update the rollout engine must sample the current adapted weights ``W0 + (alpha/r) B A``. Two ways:

- **merged** (tepo's path, ``tepo.rollout.vllm``): the trainer writes the merged weights under the base model's
  names (``write_weights`` -> ``merged_state_dict``, bf16, lm_head untied, 326 MB for the embedded model) and the
  engine, built on that folder, replaces its weights in place (``collective_rpc("reload_weights")`` and
  ``reset_prefix_cache()``, as ``vllm_server._reload`` does).
- **native**: the engine is built on the *base* weights with ``enable_lora=True, max_lora_rank=16, max_loras=1``;
  the trainer writes only the adapter (peft ``save_pretrained``, 20 MB in float32) and every generate passes a new
  ``LoRARequest`` (a new name and int id per update, the same folder), which vLLM loads and activates on first use.

Measured, each engine in a fresh process of the vLLM interpreter built as tepo builds it (bf16, eager, token ids
in and out, processed log-probs, 256 MiB KV cache, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, OpenMP threads bound to
every allowed core):

- **sync seconds** (engine side), ``--syncs`` times, median: merged = reload + reset_prefix_cache, plus whatever
  the first generate after it costs more than the next one; native = the first generate with a new adapter id
  minus a second generate with that id (a 1-token generate of one prompt, prefix cache reset before each), i.e.
  loading and activating the adapter. One more native sync is split into ``llm_engine.add_lora`` (load from
  disk into vLLM's CPU cache) and activation (the extra cost of the first generate). The trainer side, writing
  the merged folder against writing the adapter folder, is timed in the preparation step (median of 3).
- **generation tok/s**, ``--repeats`` times, median: the training-shaped workload, 4 chat prompts x 8 samples,
  temperature 1, top_p 1, no top-k, 64 new tokens at most, stop at EOS, log-prob of every sampled token returned
  (as tepo's rollouts ask), prefix cache reset before each repeat; tokens generated / seconds of ``llm.generate``.
  The native engine is also timed once with no adapter (the cost of the LoRA kernels themselves).
- **correctness**: the float32 HF peft model's greedy continuations (32 tokens) of the 4 prompts are scored
  teacher-forced by the merged engine, the native engine with the adapter and the native engine without it (one
  1-token request per position, the reference token's log-prob among the top 20 at temperature 1; vLLM's
  ``prompt_logprobs`` fails for a batch of LoRA requests on this build, which the script probes last): mean
  absolute per-token log-prob gaps against the float32 adapted and base models, and greedy (32-token)
  agreement between the engines. Passes when merged and native differ from each other by at
  most 1.5x (+0.01) the larger of their gaps to float32 (bf16 noise), and the engine without the adapter is more
  than twice that noise away from the adapted reference (the adapter is visible).

The adapter: peft LoRA rank 16, alpha 16, on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (every
linear layer but lm_head) of the embedded SmolLM2-135M-Instruct, A at peft's init and B ~ N(0, ``--b-std``^2)
(B = 0 would be the base model), seeded.

Run (from the repository root; the vLLM CPU build lives only in .venv-vllm, tepo and peft in .venv; one run takes
about 4 minutes on an idle 2-core machine, most of it the native engine's slow LoRA generation):

    .venv-vllm/bin/python benchmarks/bench_vllm_lora.py [--json out.json]

The script runs itself three times over: ``--role prepare`` with ``--tepo-python`` (writes the base, merged and
adapter folders, the prompts and the float32 references into a temporary folder in /dev/shm), then ``--role
engine --kind merged`` and ``--kind native`` with the vLLM interpreter. If vLLM's CPU build cannot serve LoRA (an
error building the LoRA engine or generating with the adapter), that error is printed as the finding and the
script exits 0. Each engine's vLLM log is kept in the work folder with ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
RANK = 16
ALPHA = 16.0
REF_TOKENS = 32  # greedy continuation length of the correctness check
TOP_LOGPROBS = 20  # vLLM's default max_logprobs
KV_CACHE_BYTES = 256 * 2**20  # tepo's default rollout.vllm.kv_cache_gb = 0.25
PROMPTS = [
    "What is 17 times 23? Think step by step.",
    "Write a haiku about the sea.",
    "Name three prime numbers greater than 50 and explain why they are prime.",
    "Explain in two sentences why the sky is blue.",
]


def _median(values):
    return statistics.median(values) if values else float("nan")


def _loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


# --------------------------------------------------------------------------------------------------------------
# Preparation (tepo's interpreter: torch, transformers, peft, tepo)
# --------------------------------------------------------------------------------------------------------------


def _completion_logprobs(model, full, prompt_len: int) -> list[float]:
    """Teacher-forced log-probs (float32 log-softmax) of ``full[0, prompt_len:]`` under ``model``."""
    import torch

    logits = model(input_ids=full).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs.gather(-1, full[0, 1:, None])[:, 0][prompt_len - 1 :].tolist()


def prepare(work: Path, b_std: float, seed: int, ref_tokens: int) -> dict:
    """Write base/, merged/ and adapter/ into ``work``, time the trainer side of a sync, compute float32 references."""
    import torch
    from safetensors.torch import load_file

    from tepo.config import LoraConfig
    from tepo.lora import apply_lora
    from tepo.models import load_model_and_tokenizer
    from tepo.rollout.base import eos_token_ids
    from tepo.rollout.vllm import write_weights

    torch.manual_seed(seed)
    model, tokenizer = load_model_and_tokenizer(None)
    eos = eos_token_ids(model, tokenizer)
    prompt_ids = []
    for text in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if hasattr(ids, "keys"):  # a BatchEncoding on some transformers versions
            ids = ids["input_ids"]
        prompt_ids.append([int(t) for t in ids])

    write_weights(model, work / "base", torch.bfloat16)  # before the adapters go in

    model = apply_lora(model, LoraConfig(rank=RANK, alpha=ALPHA, dropout=0.0, target_modules=TARGETS))
    from peft.tuners.lora import LoraLayer

    gen = torch.Generator().manual_seed(seed + 1)
    adapted = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLayer):
                for name in module.lora_B:
                    weight = module.lora_B[name].weight
                    weight.copy_(torch.randn(weight.shape, generator=gen) * b_std)
                    adapted += 1
    model.eval()

    # Trainer side of one sync, each way (median of 3): the merged folder vs the adapter folder.
    merged_s, adapter_s = [], []
    for _ in range(3):
        start = time.perf_counter()
        merged_bytes = write_weights(model, work / "merged", torch.bfloat16)
        merged_s.append(time.perf_counter() - start)
    for _ in range(3):
        start = time.perf_counter()
        model.save_pretrained(str(work / "adapter"))
        adapter_s.append(time.perf_counter() - start)
    adapter_bytes = sum(p.stat().st_size for p in (work / "adapter").glob("*.safetensors"))

    # Sanity: the merged file is W0 + (alpha/r) B A of one adapted layer.
    merged = load_file(str(work / "merged" / "model.safetensors"))
    base = load_file(str(work / "base" / "model.safetensors"))
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    expected = (
        layer.base_layer.weight
        + (ALPHA / RANK) * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    )
    merge_err = float((merged["model.layers.0.self_attn.q_proj.weight"].float() - expected).abs().max())
    delta = float(
        (
            merged["model.layers.0.self_attn.q_proj.weight"].float()
            - base["model.layers.0.self_attn.q_proj.weight"].float()
        )
        .abs()
        .mean()
    )

    # Float32 references: the adapted model's greedy continuations, scored by the adapted and the base model.
    sequences, ref_adapted, ref_base, ref_greedy = [], [], [], []
    with torch.no_grad():
        for ids in prompt_ids:
            inp = torch.tensor([ids])
            out = model.generate(
                input_ids=inp,
                attention_mask=torch.ones_like(inp),
                max_new_tokens=ref_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
            )[0].tolist()
            completion = out[len(ids) :]
            ref_greedy.append(completion)
            full = torch.tensor([out])
            sequences.append({"prompt": ids, "completion": completion})
            ref_adapted.append(_completion_logprobs(model, full, len(ids)))
            with model.disable_adapter():
                ref_base.append(_completion_logprobs(model, full, len(ids)))

    meta = {
        "prompt_ids": prompt_ids,
        "eos_token_ids": eos,
        "max_model_len": min(int(getattr(model.config, "max_position_embeddings", 4096) or 4096), 4096),
        "sequences": sequences,
        "ref_adapted_logprobs": ref_adapted,
        "ref_base_logprobs": ref_base,
        "ref_greedy": ref_greedy,
        "lora_layers": adapted,
        "b_std": b_std,
        "write_merged_s": _median(merged_s),
        "write_merged_all_s": merged_s,
        "write_adapter_s": _median(adapter_s),
        "write_adapter_all_s": adapter_s,
        "merged_bytes": merged_bytes,
        "adapter_bytes": adapter_bytes,
        "merge_check_max_abs_err": merge_err,
        "merge_check_mean_abs_delta": delta,
    }
    (work / "prepared.json").write_text(json.dumps(meta))
    return meta


# --------------------------------------------------------------------------------------------------------------
# One engine (the vLLM interpreter)
# --------------------------------------------------------------------------------------------------------------


def _probe_prompt_logprobs(llm, sampling_params_cls, sequences: list[dict], lora_request) -> str:
    """ "ok", or the last line of the error, for one generate with ``prompt_logprobs=0`` over ``sequences``."""
    try:
        llm.generate(
            [{"prompt_token_ids": s["prompt"] + s["completion"]} for s in sequences],
            sampling_params_cls(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False),
            use_tqdm=False,
            lora_request=lora_request,
        )
        return "ok"
    except Exception as err:
        lines = [line for line in traceback.format_exc().strip().splitlines() if line.strip()]
        return lines[-1] if lines else repr(err)


def run_engine(kind: str, work: Path, out: Path, syncs: int, repeats: int, seed: int) -> int:
    result: dict = {"kind": kind, "loadavg_start": _loadavg()}
    stage = "import"

    def save() -> None:
        result["loadavg_end"] = _loadavg()
        out.write_text(json.dumps(result))

    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        result["vllm"] = vllm.__version__
        meta = json.loads((work / "prepared.json").read_text())
        eos = meta["eos_token_ids"]
        prompts = [{"prompt_token_ids": ids} for ids in meta["prompt_ids"]]
        native = kind == "native"
        adapter = str(work / "adapter")
        version = 0

        def new_adapter():
            nonlocal version
            version += 1
            # LoRARequest compares by name: a new update needs a new name as well as a new id.
            return LoRARequest(f"tepo-update-{version}", version, adapter)

        stage = "build"
        options = dict(
            dtype="bfloat16",
            max_model_len=meta["max_model_len"],
            seed=seed,
            enforce_eager=True,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=0.3,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        if native:
            options.update(enable_lora=True, max_lora_rank=RANK, max_loras=1)
        start = time.perf_counter()
        llm = LLM(model=str(work / ("base" if native else "merged")), **options)
        result["build_s"] = time.perf_counter() - start

        tiny = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

        def tiny_generate(request) -> float:
            llm.reset_prefix_cache()
            start = time.perf_counter()
            llm.generate(prompts[:1], tiny, use_tqdm=False, lora_request=request)
            return time.perf_counter() - start

        current = None
        stage = "first generate with the adapter" if native else "first generate"
        if native:
            current = new_adapter()
        result["first_generate_s"] = tiny_generate(current)  # warm-up (first load of the adapter, if any)
        tiny_generate(current)

        # Syncs: what every update costs the engine.
        stage = "sync"
        sync_s, parts = [], []
        for _ in range(syncs):
            if native:
                current = new_adapter()
                first = tiny_generate(current)  # loads and activates the new adapter
                again = tiny_generate(current)
                sync_s.append(first - again)
                parts.append({"first_generate_s": first, "second_generate_s": again})
            else:
                start = time.perf_counter()
                llm.collective_rpc("reload_weights", kwargs={"weights_path": str(work / "merged")})
                llm.reset_prefix_cache()
                reload = time.perf_counter() - start
                first = tiny_generate(None)
                again = tiny_generate(None)
                sync_s.append(reload + first - again)
                parts.append({"reload_s": reload, "first_generate_s": first, "second_generate_s": again})
        result["sync_s"] = _median(sync_s)
        result["sync_all_s"] = sync_s
        result["sync_parts"] = parts
        if native:
            current = new_adapter()
            start = time.perf_counter()
            added = llm.llm_engine.add_lora(current)
            add_s = time.perf_counter() - start
            first = tiny_generate(current)
            again = tiny_generate(current)
            result["explicit_sync"] = {
                "add_lora_returned": bool(added),
                "add_lora_s": add_s,
                "activation_s": first - again,
                "total_s": add_s + first - again,
            }

        # Generation throughput at the training shape.
        stage = "generation"

        def workload(request, rep: int) -> dict:
            params = [
                SamplingParams(
                    n=8,
                    max_tokens=64,
                    temperature=1.0,
                    top_p=1.0,
                    top_k=0,
                    min_p=0.0,
                    seed=seed + 1000 * rep + i,
                    stop_token_ids=eos,
                    ignore_eos=False,
                    logprobs=0,
                    detokenize=False,
                    skip_special_tokens=False,
                )
                for i in range(len(prompts))
            ]
            llm.reset_prefix_cache()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=request)
            seconds = time.perf_counter() - start
            tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
            return {"seconds": seconds, "tokens": tokens, "tok_s": tokens / seconds}

        runs = [workload(current, rep) for rep in range(repeats)]
        result["generation"] = runs
        result["tok_s"] = _median([r["tok_s"] for r in runs])
        if native:
            stage = "generation without adapter"
            base_run = workload(None, 0)
            result["generation_no_adapter"] = base_run

        # Correctness: teacher-forced log-probs of the float32 references' tokens, and greedy continuations.
        # prompt_logprobs would score a sequence in one request, but with a LoRA request it fails on this build
        # (probed below), so every position is its own 1-token request: the next token's log-prob among the top
        # 20 (temperature 1, top_p 1, no top-k: the processed log-probs are the raw log-softmax). Unseeded: a
        # seeded request split by chunked prefill fails on this build ("CPU Generator does not use offset").
        stage = "correctness"
        score_params = SamplingParams(
            max_tokens=1,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            logprobs=TOP_LOGPROBS,
            detokenize=False,
        )

        def score(request) -> list[list[float | None]]:
            seqs, requests, targets = meta["sequences"], [], []
            for i, s in enumerate(seqs):
                ids = s["prompt"] + s["completion"]
                for j in range(len(s["prompt"]), len(ids)):
                    requests.append({"prompt_token_ids": ids[:j]})
                    targets.append((i, ids[j]))
            llm.reset_prefix_cache()
            outputs = llm.generate(requests, score_params, use_tqdm=False, lora_request=request)
            scores: list[list[float | None]] = [[] for _ in seqs]
            for (i, target), o in zip(targets, outputs):
                step = o.outputs[0].logprobs[0]
                scores[i].append(float(step[target].logprob) if target in step else None)
            return scores

        greedy_params = SamplingParams(
            max_tokens=REF_TOKENS, temperature=0.0, stop_token_ids=eos, detokenize=False
        )

        def greedy(request) -> list[list[int]]:
            llm.reset_prefix_cache()
            outputs = llm.generate(prompts, greedy_params, use_tqdm=False, lora_request=request)
            return [list(o.outputs[0].token_ids) for o in outputs]

        start = time.perf_counter()
        result["scores"] = score(current)
        result["greedy"] = greedy(current)
        if native:
            result["scores_no_adapter"] = score(None)
            result["greedy_no_adapter"] = greedy(None)
        result["correctness_s"] = time.perf_counter() - start

        # Last, as it may leave the engine unusable: does prompt_logprobs work (with the adapter, if any) for one
        # request alone and for the 4 sequences in one batch?
        stage = "prompt_logprobs probe"
        result["prompt_logprobs"] = {
            "1 request": _probe_prompt_logprobs(llm, SamplingParams, meta["sequences"][:1], current),
            "4 requests": _probe_prompt_logprobs(llm, SamplingParams, meta["sequences"], current),
        }
        stage = "done"
    except Exception as err:
        lines = [line for line in traceback.format_exc().strip().splitlines() if line.strip()]
        result["error"] = {
            "stage": stage,
            "line": lines[-1] if lines else repr(err),
            "traceback": traceback.format_exc(),
        }
    save()
    return 0


# --------------------------------------------------------------------------------------------------------------
# The parent: runs the three steps, compares, prints
# --------------------------------------------------------------------------------------------------------------


def _engine_env() -> dict:
    # tepo.rollout.vllm._server_env: engine in-process, OpenMP threads on every allowed core.
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.pop("PYTHONPATH", None)
    return env


def _run_child(cmd: list[str], log: Path, env: dict | None = None) -> int:
    with open(log, "ab") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT)).returncode


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _gap(a: list[list[float | None]], b: list[list[float | None]]) -> float:
    """Mean |a - b| over the positions both have (None: the token was not in the engine's top 20)."""
    diffs = [abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys) if x is not None and y is not None]
    return sum(diffs) / len(diffs) if diffs else float("nan")


def _missing(a: list[list[float | None]]) -> int:
    return sum(x is None for xs in a for x in xs)


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    same = sum(x == y for x, y in zip(a, b))
    prefix = []
    for x, y in zip(a, b):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        prefix.append(k)
    return {"identical": same, "of": len(a), "common_prefix": prefix}


def compare(meta: dict, merged: dict, native: dict) -> dict:
    ref_a, ref_b = meta["ref_adapted_logprobs"], meta["ref_base_logprobs"]
    effect = _gap(ref_a, ref_b)
    gaps = {
        "fp32 adapted vs fp32 base (adapter effect)": effect,
        "merged vs fp32 adapted": _gap(merged["scores"], ref_a),
        "native vs fp32 adapted": _gap(native["scores"], ref_a),
        "merged vs native": _gap(merged["scores"], native["scores"]),
        "native no-adapter vs fp32 adapted": _gap(native["scores_no_adapter"], ref_a),
        "native no-adapter vs fp32 base": _gap(native["scores_no_adapter"], ref_b),
    }
    greedy = {
        "merged vs native": _agreement(merged["greedy"], native["greedy"]),
        "merged vs fp32 adapted": _agreement(merged["greedy"], meta["ref_greedy"]),
        "native vs fp32 adapted": _agreement(native["greedy"], meta["ref_greedy"]),
        "native vs native no-adapter": _agreement(native["greedy"], native["greedy_no_adapter"]),
    }
    # The engines agree with each other about as well as bf16 agrees with float32, and the adapter is visible
    # above that bf16 noise.
    noise = max(gaps["merged vs fp32 adapted"], gaps["native vs fp32 adapted"])
    ok = (
        gaps["merged vs native"] <= 1.5 * noise + 0.01
        and gaps["native no-adapter vs fp32 adapted"] > 2 * noise
    )
    missing = {
        "merged": _missing(merged["scores"]),
        "native": _missing(native["scores"]),
        "native no-adapter": _missing(native["scores_no_adapter"]),
    }
    return {"logprob_gaps": gaps, "outside_top20": missing, "greedy_agreement": greedy, "pass": ok}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write every number to this file")
    parser.add_argument("--syncs", type=int, default=3, help="syncs timed per engine (median)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="generation workloads timed per engine (median)"
    )
    parser.add_argument("--b-std", type=float, default=0.1, help="std of the adapter's random B")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tepo-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--vllm-python", default=sys.executable)
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (weights, logs) and print it"
    )
    parser.add_argument(
        "--role", choices=("main", "prepare", "engine"), default="main", help=argparse.SUPPRESS
    )
    parser.add_argument("--kind", choices=("merged", "native"), help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.role == "prepare":
        prepare(args.work, args.b_std, args.seed, ref_tokens=REF_TOKENS)
        return 0
    if args.role == "engine":
        return run_engine(args.kind, args.work, args.out, args.syncs, args.repeats, args.seed)

    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="tepo-bench-vllm-lora-", dir=shm if shm.is_dir() else None))
    me = str(Path(__file__).resolve())
    try:
        print(f"load average at start: {_loadavg()}", flush=True)
        start = time.perf_counter()
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        rc = _run_child(
            [
                args.tepo_python,
                me,
                "--role",
                "prepare",
                "--work",
                str(work),
                "--b-std",
                str(args.b_std),
                "--seed",
                str(args.seed),
            ],
            work / "prepare.log",
            env,
        )
        if rc != 0 or not (work / "prepared.json").exists():
            print(f"preparation failed (rc {rc}):\n{_tail(work / 'prepare.log')}")
            return 1
        meta = json.loads((work / "prepared.json").read_text())
        print(
            f"prepared in {time.perf_counter() - start:.1f} s: {meta['lora_layers']} LoRA layers, merged "
            f"{meta['merged_bytes'] / 1e6:.0f} MB, adapter {meta['adapter_bytes'] / 1e6:.1f} MB; merge check "
            f"max |merged - (W0 + s B A)| = {meta['merge_check_max_abs_err']:.2e} (bf16 rounding), mean |delta W| "
            f"= {meta['merge_check_mean_abs_delta']:.2e}",
            flush=True,
        )

        results = {}
        for kind in ("merged", "native"):
            out = work / f"{kind}.json"
            start = time.perf_counter()
            rc = _run_child(
                [
                    args.vllm_python,
                    me,
                    "--role",
                    "engine",
                    "--kind",
                    kind,
                    "--work",
                    str(work),
                    "--out",
                    str(out),
                    "--syncs",
                    str(args.syncs),
                    "--repeats",
                    str(args.repeats),
                    "--seed",
                    str(args.seed),
                ],
                work / f"{kind}.log",
                _engine_env(),
            )
            if not out.exists():
                print(
                    f"{kind} engine process died (rc {rc}) before reporting:\n{_tail(work / f'{kind}.log')}"
                )
                return 1
            results[kind] = json.loads(out.read_text())
            r = results[kind]
            print(
                f"{kind}: {time.perf_counter() - start:.0f} s wall, load average {r['loadavg_start']} -> "
                f"{r['loadavg_end']}",
                flush=True,
            )

        merged, native = results["merged"], results["native"]
        report = {"prepared": {k: v for k, v in meta.items() if not k.startswith(("ref_", "sequences"))}}
        report.update(merged=merged, native=native)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        if "error" in merged:
            print(f"merged engine failed at {merged['error']['stage']}:\n{merged['error']['traceback']}")
            print(_tail(work / "merged.log"))
            return 1
        if "error" in native:
            err = native["error"]
            print(
                f"\nFINDING: vLLM {native.get('vllm', '?')} (CPU build) native LoRA engine failed at "
                f"{err['stage']} (stages before 'correctness' mean it cannot serve LoRA):\n  {err['line']}\n\n"
                f"{err['traceback']}"
            )
            report["finding"] = f"native LoRA failed at {err['stage']}: {err['line']}"
            if args.json:
                args.json.write_text(json.dumps(report, indent=2))
            return 0

        check = compare(meta, merged, native)
        report["correctness"] = check
        print(
            f"\nvLLM {merged['vllm']} CPU build; correctness (mean |log-prob gap| per token, "
            f"{sum(len(s) for s in meta['ref_adapted_logprobs'])} tokens of the float32 adapted model's "
            "greedy continuations):"
        )
        for name, value in check["logprob_gaps"].items():
            print(f"  {name:45s} {value:.4f}")
        print(
            f"  reference tokens outside an engine's top {TOP_LOGPROBS} (left out): {check['outside_top20']}"
        )
        print(
            f"  prompt_logprobs probe: merged {merged.get('prompt_logprobs')!r}; native with the adapter "
            f"{native.get('prompt_logprobs')!r}"
        )
        print(f"greedy continuations ({REF_TOKENS} tokens):")
        for name, value in check["greedy_agreement"].items():
            print(
                f"  {name:45s} identical {value['identical']}/{value['of']}, common prefix {value['common_prefix']}"
            )
        print(f"  -> {'PASS' if check['pass'] else 'FAIL'}: merged and native sample the same adapted policy")

        sync_total_m = meta["write_merged_s"] + merged["sync_s"]
        sync_total_n = meta["write_adapter_s"] + native["sync_s"]
        rows = [
            ("trainer write (s)", meta["write_merged_s"], meta["write_adapter_s"]),
            ("engine sync (s)", merged["sync_s"], native["sync_s"]),
            ("sync total (s)", sync_total_m, sync_total_n),
            ("generation tok/s", merged["tok_s"], native["tok_s"]),
            ("engine build (s)", merged["build_s"], native["build_s"]),
        ]
        print(f"\n{'':22s} {'merged':>10s} {'native':>10s} {'native/merged':>14s}")
        for name, m, n in rows:
            print(f"{name:22s} {m:10.3f} {n:10.3f} {n / m:14.2f}")
        ex = native["explicit_sync"]
        tok_s_m = [round(r["tok_s"]) for r in merged["generation"]]
        tok_s_n = [round(r["tok_s"]) for r in native["generation"]]
        print(
            f"\nnative engine without adapter: {native['generation_no_adapter']['tok_s']:.0f} tok/s\n"
            f"one native sync split: add_lora {ex['add_lora_s']:.3f} s + activation {ex['activation_s']:.3f} s\n"
            f"each engine sync (s): merged {[round(s, 3) for s in merged['sync_all_s']]}, native "
            f"{[round(s, 3) for s in native['sync_all_s']]}\n"
            f"each generation (tok/s): merged {tok_s_m}, native {tok_s_n}\n"
            f"correctness scoring took merged {merged['correctness_s']:.0f} s, native {native['correctness_s']:.0f} s"
        )
        print(f"load average at end: {_loadavg()}")
        report["table"] = {name: {"merged": m, "native": n, "ratio": n / m} for name, m, n in rows}
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        return 0
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":  # vLLM may spawn workers: keep everything under this guard
    sys.exit(main())
