"""tepo's vLLM rollout server: one vLLM engine behind a JSON-lines pipe, started by :class:`tepo.rollout.vllm.VLLMRollout`.

This file is run as a script by the interpreter of the environment that has vLLM (``.venv-vllm/bin/python``
for the CPU build, see ``scripts/install_vllm_cpu.sh``; any interpreter with ``vllm`` on a GPU machine). It imports
nothing from tepo, so that environment does not need tepo or the trainer's dependencies.

Protocol: one JSON object per line on ``--in-fd``, one JSON reply per line on ``--out-fd`` (stdout and stderr are
left to vLLM's own logging). Only token ids, numbers and a folder path cross the pipe: no pickle, no code.

- on start-up, once the engine is built: ``{"ok": true, "ready": true, "vllm": version, "seconds": s, ...}`` with
  the engine's batch limits, its compilation mode and its KV-cache block size
- ``{"cmd": "generate", "prompts": [[id, ...], ...], "n": G, "max_tokens": T, "temperature": t, "top_p": p,
  "greedy": bool, "seed": s | null, "logprobs": bool, "stop_token_ids": [...], "min_tokens": k (optional, 0)}`` ->
  ``{"ok": true, "outputs": [[{"token_ids": [...], "logprobs": [...] | null, "finish_reason": str}, ...G], ...],
  "seconds": s, "prefix_cached_tokens": k}``
- ``{"cmd": "reload", "path": folder}`` (a folder with ``model.safetensors``): the engine's weights are
  replaced in place from it (``reload_weights``; no restart) -> ``{"ok": true, "seconds": s}``
- ``{"cmd": "score", "sequences": [[id, ...], ...], "starts": [k, ...]}`` -> ``{"ok": true, "logprobs":
  [[lp, ...], ...], "seconds": s}``: each sequence's own tokens from position ``k`` on, scored by the engine's
  current weights in one prefill (vLLM's ``prompt_logprobs``: the raw log-softmax, no sampling settings applied);
  row ``i`` has ``len(sequence_i) - k_i`` values. Used by tepo's parity guard (``tepo.rollout.parity``).
- ``{"cmd": "shutdown"}`` -> ``{"ok": true}``, then the process exits.
A failing command answers ``{"ok": false, "error": "..."}`` and the server keeps serving.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback

# Run as a script, this file's folder comes first on sys.path, and it holds tepo's own ``vllm.py`` (the client),
# which would shadow the real vllm package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]


def _sampling_params(request: dict, prompt_number: int):
    from vllm import SamplingParams

    seed = request.get("seed")
    greedy = bool(request.get("greedy"))
    return SamplingParams(
        # vLLM refuses n > 1 with greedy decoding; greedy samples are all the same, so one is copied n times.
        n=1 if greedy else int(request["n"]),
        max_tokens=int(request["max_tokens"]),
        # Exactly softmax(logits / temperature) restricted to the top-p nucleus, as tepo's HF backend and its
        # log-prob scorer use: no top-k, no min-p, no penalties.
        temperature=0.0 if greedy else float(request["temperature"]),
        top_p=1.0 if greedy else float(request["top_p"]),
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        # One generator per prompt, seeded from the step's seed and the prompt's position: the same request gives
        # the same samples, whatever else the engine is batching.
        seed=None if seed is None else int(seed) + prompt_number,
        stop_token_ids=[int(t) for t in request.get("stop_token_ids", [])],
        ignore_eos=False,
        # Benchmarks only (bench_vs_trl.py --fixed-length): no stop token before this many tokens.
        min_tokens=int(request.get("min_tokens", 0)),
        logprobs=0 if request.get("logprobs") else None,
        detokenize=False,
        skip_special_tokens=False,
    )


def _whole_prefill_settings(max_model_len: int, chunked_prefill: str = "auto") -> dict:
    """Engine settings that keep every request's prefill inside one engine step, on the CPU platform only.

    Why: tepo seeds every sampled request (one ``torch.Generator`` per prompt, see :func:`_sampling_params`). When
    chunked prefill splits a prompt over several engine steps, vLLM still samples a token for it at the end of each
    partial step and discards it, rewinding the request's generator by its Philox offset
    (``GPUModelRunner._bookkeeping_sync``: ``gen.set_offset(gen.get_offset() - 4)``). A CPU generator (Mersenne
    Twister) has no offset, so vLLM 0.32's CPU runner raises "CPU Generator does not use offset" for any batch whose
    prompts exceed the step's token budget (``max_num_batched_tokens``, 4096 on CPU): 16 GSM8K prompts x 8 samples
    already do. With chunked prefill off, vLLM's scheduler schedules a waiting request only when its whole prompt
    fits in what is left of the step's budget (``Scheduler.schedule``: "If chunked_prefill is disabled, we can stop
    the scheduling here"), and a budget of at least ``max_model_len`` lets any single request fit: no request is
    ever partially prefilled, so nothing is discarded and nothing needs rewinding. The other fixes were worse:
    unseeded requests lose reproducibility (a resumed run would not sample what it would have), and splitting what
    tepo sends into waves only moves the budget problem to tepo. The cost, measured by
    ``benchmarks/bench_scaling.py``, is that a step with a long prefill is not mixed with decoding tokens.
    On a GPU, generators have offsets and chunked prefill stays as vLLM sets it. ``chunked_prefill``: "auto" (the
    above), "on" (vLLM's default everywhere: only for unseeded requests, e.g. to measure the cost), "off".
    """
    from vllm.platforms import current_platform

    if chunked_prefill == "on" or (chunked_prefill == "auto" and not current_platform.is_cpu()):
        return {}
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(max_model_len), 4096)}


def _generate(llm, request: dict) -> dict:
    prompts = [{"prompt_token_ids": [int(t) for t in ids]} for ids in request["prompts"]]
    params = [_sampling_params(request, i) for i in range(len(prompts))]
    start = time.perf_counter()
    results = llm.generate(prompts, params, use_tqdm=False)
    outputs = []
    for result in results:
        samples = []
        completions = sorted(result.outputs, key=lambda c: c.index)
        if request.get("greedy"):
            completions = completions[:1] * int(request["n"])
        for completion in completions:
            logprobs = None
            if request.get("logprobs") and completion.logprobs is not None:
                logprobs = [
                    float(step[token].logprob)
                    for step, token in zip(completion.logprobs, completion.token_ids)
                ]
            samples.append(
                {
                    "token_ids": list(completion.token_ids),
                    "logprobs": logprobs,
                    "finish_reason": completion.finish_reason,
                }
            )
        outputs.append(samples)
    return {
        "ok": True,
        "outputs": outputs,
        "seconds": time.perf_counter() - start,
        # Prompt tokens served from the prefix cache, as vLLM counts them per prompt (for a prompt sampled n
        # times: one sample's hit). A weight sync empties the cache, so after one these are a call's own
        # shared prefixes (tepo.rollout.vllm_launch.CPU_BLOCK_SIZE).
        "prefix_cached_tokens": sum(int(result.num_cached_tokens or 0) for result in results),
    }


def _score(llm, request: dict) -> dict:
    from vllm import SamplingParams

    sequences = [[int(t) for t in ids] for ids in request["sequences"]]
    starts = [int(k) for k in request["starts"]]
    if len(starts) != len(sequences) or any(not 1 <= k < len(ids) for k, ids in zip(starts, sequences)):
        raise ValueError("score: one start per sequence, each >= 1 and below the sequence's length")
    # prompt_logprobs=0: only the log-prob of each prompt token itself. max_tokens=1: nothing is decoded that
    # matters; the one sampled token is dropped. Requests that ask for prompt log-probs bypass the prefix cache.
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    start = time.perf_counter()
    results = llm.generate([{"prompt_token_ids": ids} for ids in sequences], params, use_tqdm=False)
    rows = []
    for result, ids, k in zip(results, sequences, starts):
        scored = result.prompt_logprobs  # position 0 (no context) is None
        rows.append([float(scored[t][ids[t]].logprob) for t in range(k, len(ids))])
    return {"ok": True, "logprobs": rows, "seconds": time.perf_counter() - start}


def _reload(llm, request: dict) -> dict:
    start = time.perf_counter()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(request["path"])})
    # Cached prefixes were computed with the old weights.
    llm.reset_prefix_cache()
    return {"ok": True, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return _serve(args)
    finally:
        if args.remove_model_dir_at_exit:
            # The trainer's copy of the weights for this server only; it cannot remove it if it was killed.
            shutil.rmtree(args.model, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    """The server's command line (built by tepo.rollout.vllm.VLLMRollout)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="folder with config.json and model.safetensors")
    parser.add_argument("--dtype", required=True)  # chosen by tepo.rollout.vllm (tepo.precision), never here
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--kv-cache-bytes", type=int, default=None, help="KV-cache budget (default: vLLM's)")
    parser.add_argument(
        "--enforce-eager", type=int, choices=(0, 1), default=1, help="1: no CUDA graphs / compile (CPU)"
    )
    parser.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV-cache block (default: vLLM's for the device)",
    )
    parser.add_argument(
        "--chunked-prefill", choices=("auto", "on", "off"), default="auto", help="see _whole_prefill_settings"
    )
    parser.add_argument("--in-fd", type=int, required=True)
    parser.add_argument("--out-fd", type=int, required=True)
    parser.add_argument("--remove-model-dir-at-exit", type=int, default=0, help="1: delete --model on exit")
    return parser


def _exit_with_parent(weights_dir: str | None) -> None:
    """Exit as soon as the trainer that started this server is gone, even in the middle of a generate.

    Between requests a dead trainer shows as end-of-file on the request pipe, but a long generate (a 512-row batch,
    a held-out evaluation) would otherwise run to its end first: a killed run left its server computing on every
    core for minutes. A daemon thread notices the re-parenting within a second and ends the process (the engine
    runs in this process: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        if weights_dir:
            shutil.rmtree(weights_dir, ignore_errors=True)
        os._exit(3)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _serve(args) -> int:
    _exit_with_parent(args.model if args.remove_model_dir_at_exit else None)
    requests = os.fdopen(args.in_fd, "r", encoding="utf-8")
    replies = os.fdopen(args.out_fd, "w", encoding="utf-8")

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    start = time.perf_counter()
    try:
        import vllm
        from vllm import LLM

        llm = LLM(
            **_whole_prefill_settings(args.max_model_len, args.chunked_prefill),
            model=args.model,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            seed=args.seed,
            # Chosen per device by tepo.rollout.vllm_launch.engine_memory_options: eager on the CPU unless
            # rollout.vllm.compile (its start-up is 15-85 s against 3 s), CUDA graphs on a GPU.
            enforce_eager=bool(args.enforce_eager),
            # Token ids in, token ids out: tepo tokenizes and decodes with its own tokenizer.
            skip_tokenizer_init=True,
            # Log-probs after temperature and top-p, the distribution actually sampled from (what the HF
            # backend's rollout_logp holds).
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_memory_bytes=args.kv_cache_bytes,
            # Prefix sharing is by whole blocks (tepo.rollout.vllm_launch.CPU_BLOCK_SIZE says why it matters).
            **({"block_size": int(args.block_size)} if args.block_size is not None else {}),
        )
    except Exception:
        reply({"ok": False, "error": traceback.format_exc()})
        return 1
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    reply(
        {
            "ok": True,
            "ready": True,
            "vllm": vllm.__version__,
            "seconds": time.perf_counter() - start,
            # The engine's per-step limits: how many rows to send at once (tepo.rollout.vllm.preferred_batch_rows).
            "max_num_seqs": int(scheduler.max_num_seqs),
            "max_num_batched_tokens": int(scheduler.max_num_batched_tokens),
            "chunked_prefill": bool(scheduler.enable_chunked_prefill),
            # What vLLM made of --enforce-eager on this device (e.g. NONE, DYNAMO_TRACE_ONCE on the CPU).
            "compilation": getattr(llm.llm_engine.vllm_config.compilation_config.mode, "name", None),
            "block_size": int(llm.llm_engine.vllm_config.cache_config.block_size),
        }
    )

    handlers = {"generate": _generate, "reload": _reload, "score": _score}
    for line in requests:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            command = request.get("cmd")
            if command == "shutdown":
                reply({"ok": True})
                break
            if command not in handlers:
                raise ValueError(
                    f"unknown command {command!r}; expected one of {sorted(handlers)} or shutdown"
                )
            reply(handlers[command](llm, request))
        except Exception:
            error = traceback.format_exc()
            print(error, file=sys.stderr, flush=True)  # the server's log keeps the whole traceback
            reply({"ok": False, "error": error})
    return 0


if (
    __name__ == "__main__"
):  # vLLM's engine starts worker processes by spawning: keep start-up under this guard
    sys.exit(main())
