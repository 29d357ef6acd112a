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

This program runs two others, one program a file: ``_vllm_lora_prepare.py`` with ``--tepo-python`` (writes the
base, merged and adapter folders, the prompts and the float32 references into a temporary folder in /dev/shm),
then ``_vllm_lora_engine.py --kind merged`` and ``--kind native`` with the vLLM interpreter (constants they share:
``_vllm_lora_common.py``). If vLLM's CPU build cannot serve LoRA (an
error building the LoRA engine or generating with the adapter), that error is printed as the finding and the
script exits 0. Each engine's vLLM log is kept in the work folder with ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _vllm_lora_common import REF_TOKENS, ROOT, TOP_LOGPROBS, loadavg

HERE = Path(__file__).resolve().parent


def _engine_env() -> dict:
    # tepo.rollout.vllm_launch.server_env: engine in-process, OpenMP threads on every allowed core.
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


def _parse_args(argv):
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
    return parser.parse_args(argv)


def _prepare(args, work: Path) -> dict | None:
    """The preparation program's folders and references (None when it failed, said why)."""
    start = time.perf_counter()
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    cmd = [args.tepo_python, str(HERE / "_vllm_lora_prepare.py"), "--work", str(work)]
    rc = _run_child([*cmd, "--b-std", str(args.b_std), "--seed", str(args.seed)], work / "prepare.log", env)
    if rc != 0 or not (work / "prepared.json").exists():
        print(f"preparation failed (rc {rc}):\n{_tail(work / 'prepare.log')}")
        return None
    meta = json.loads((work / "prepared.json").read_text())
    print(
        f"prepared in {time.perf_counter() - start:.1f} s: {meta['lora_layers']} LoRA layers, merged "
        f"{meta['merged_bytes'] / 1e6:.0f} MB, adapter {meta['adapter_bytes'] / 1e6:.1f} MB; merge check "
        f"max |merged - (W0 + s B A)| = {meta['merge_check_max_abs_err']:.2e} (bf16 rounding), mean |delta W| "
        f"= {meta['merge_check_mean_abs_delta']:.2e}",
        flush=True,
    )
    return meta


def _engine(args, work: Path, kind: str) -> dict | None:
    """One engine program's numbers (None when it died before reporting, said why)."""
    out = work / f"{kind}.json"
    start = time.perf_counter()
    cmd = [args.vllm_python, str(HERE / "_vllm_lora_engine.py"), "--kind", kind, "--work", str(work)]
    cmd += [
        "--out",
        str(out),
        "--syncs",
        str(args.syncs),
        "--repeats",
        str(args.repeats),
        "--seed",
        str(args.seed),
    ]
    rc = _run_child(cmd, work / f"{kind}.log", _engine_env())
    if not out.exists():
        print(f"{kind} engine process died (rc {rc}) before reporting:\n{_tail(work / f'{kind}.log')}")
        return None
    r = json.loads(out.read_text())
    print(
        f"{kind}: {time.perf_counter() - start:.0f} s wall, load average {r['loadavg_start']} -> "
        f"{r['loadavg_end']}",
        flush=True,
    )
    return r


def _print_correctness(meta: dict, merged: dict, native: dict, check: dict) -> None:
    print(
        f"\nvLLM {merged['vllm']} CPU build; correctness (mean |log-prob gap| per token, "
        f"{sum(len(s) for s in meta['ref_adapted_logprobs'])} tokens of the float32 adapted model's "
        "greedy continuations):"
    )
    for name, value in check["logprob_gaps"].items():
        print(f"  {name:45s} {value:.4f}")
    print(f"  reference tokens outside an engine's top {TOP_LOGPROBS} (left out): {check['outside_top20']}")
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


def _print_table(meta: dict, merged: dict, native: dict) -> list:
    """The side-by-side table of the two ways to sync; its rows ``(name, merged, native)``."""
    rows = [
        ("trainer write (s)", meta["write_merged_s"], meta["write_adapter_s"]),
        ("engine sync (s)", merged["sync_s"], native["sync_s"]),
        (
            "sync total (s)",
            meta["write_merged_s"] + merged["sync_s"],
            meta["write_adapter_s"] + native["sync_s"],
        ),
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
    return rows


def _report(args, work: Path, meta: dict, merged: dict, native: dict) -> int:
    """Compare the two engines, print the findings and write --json."""
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
    _print_correctness(meta, merged, native, check)
    rows = _print_table(meta, merged, native)
    print(f"load average at end: {loadavg()}")
    report["table"] = {name: {"merged": m, "native": n, "ratio": n / m} for name, m, n in rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    shm = Path("/dev/shm")
    work = Path(tempfile.mkdtemp(prefix="tepo-bench-vllm-lora-", dir=shm if shm.is_dir() else None))
    try:
        print(f"load average at start: {loadavg()}", flush=True)
        meta = _prepare(args, work)
        if meta is None:
            return 1
        results = {}
        for kind in ("merged", "native"):
            results[kind] = _engine(args, work, kind)
            if results[kind] is None:
                return 1
        return _report(args, work, meta, results["merged"], results["native"])
    finally:
        if args.keep:
            print(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
