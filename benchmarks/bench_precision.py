"""float32 against bf16 on this machine: does precision ``auto`` pick the faster one here?

    .venv/bin/python benchmarks/bench_precision.py                      # ~3-5 min on 2 cores: the table
    .venv/bin/python benchmarks/bench_precision.py --out docs/results/hardware/   # also <cpu-kind>.md and .json
    .venv/bin/python benchmarks/bench_precision.py --skip-vllm --rounds 2

Measured side by side in one process (HF passes) or in alternating engine processes (vLLM), A, B, A, B, so a
change in the machine's load hits both precisions alike; medians over ``--rounds``:

- forward+backward of the embedded model (SmolLM2-135M-Instruct, float32 weights, activation checkpointing as the
  trainer runs it) over ``--rows`` x ``--tokens`` tokens: float32 against bf16 autocast (``model.autocast_bf16``);
- HF generate (``tepo.rollout.HFRollout``), ``--prompts`` x ``--samples`` x ``--new-tokens``: float32 against bf16
  autocast (``rollout.autocast_bf16``); tokens/s = generated tokens / generation seconds;
- vLLM's CPU build (``tepo.rollout.VLLMRollout``, where ``.venv-vllm`` is installed), the same workload: float32
  against bfloat16 weights (``rollout.vllm.dtype``); engine start-up is not counted.

Printed: the CPU model and the flags that decide, what ``auto`` picks here (``tepo.precision``) and, per part,
which precision was faster and whether ``auto`` chose it. ``--out DIR`` writes ``DIR/<cpu-kind>.md`` (the table and
the command) and ``DIR/<cpu-kind>.json``; whoever runs it on another kind of CPU adds that kind's file.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load_average, machine_precision, precision_line


def cpu_kind(machine: dict) -> str:
    """A file name for the kind of CPU: its model in short plus the instruction class that decides bf16."""
    flags = set(machine["cpu_flags"])
    if "amx_bf16" in flags:
        isa = "amx-bf16"
    elif "avx512_bf16" in flags:
        isa = "avx512-bf16"
    elif "bf16" in flags:
        isa = "arm-bf16"
    elif "avx512f" in flags:
        isa = "avx512-no-bf16"
    elif "avx2" in flags:
        isa = "avx2"
    else:
        isa = "baseline"
    model = re.sub(r"\((r|tm)\)|processor|cpu|\d+-core", "", machine["cpu_model"].lower())
    model = re.sub(r"[^a-z0-9]+", "-", model).strip("-")
    return f"{model}-{isa}"


def bench_forward_backward(rows: int, tokens: int, rounds: int) -> dict:
    import torch

    from tepo.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(None)
    model.train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(
        0, model.config.vocab_size, (rows, tokens), generator=torch.Generator().manual_seed(0)
    )

    def once(bf16: bool) -> float:
        model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        # cache_enabled=False as tepo's passes (tepo.training.logprob_pass.bf16_autocast)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16, cache_enabled=False):
            logits = model(input_ids=ids).logits
        torch.log_softmax(logits.float(), dim=-1).mean().backward()
        return time.perf_counter() - started

    once(False), once(True)  # warm-up: kernels, allocator
    times = {"float32": [], "bf16": []}
    for r in range(rounds):
        for bf16 in (False, True) if r % 2 == 0 else (True, False):
            times["bf16" if bf16 else "float32"].append(once(bf16))
    return {k: rows * tokens / statistics.median(v) for k, v in times.items()} | {"seconds": times}


def _prompts(tokenizer, count: int) -> list[list[int]]:
    from tepo.data import load_problems
    from tepo.data.prompts import build_prompt_ids

    problems = load_problems("arithmetic", split="train", limit=count, seed=0)
    return build_prompt_ids(tokenizer, problems, "Give the final answer as a number.")


def bench_hf_generate(prompts: int, samples: int, new_tokens: int, rounds: int) -> dict:
    from tepo.models import load_model_and_tokenizer
    from tepo.rollout import HFRollout

    model, tokenizer = load_model_and_tokenizer(None)
    ids = _prompts(tokenizer, prompts)
    engines = {
        "float32": HFRollout(model, tokenizer, autocast_bf16=False),
        "bf16": HFRollout(model, tokenizer, autocast_bf16=True),
    }
    rates = {"float32": [], "bf16": []}
    for engine in engines.values():  # warm-up
        engine.generate(ids[:1], num_samples=2, max_new_tokens=8, seed=0)
    for r in range(rounds):
        for name in ("float32", "bf16") if r % 2 == 0 else ("bf16", "float32"):
            batch = engines[name].generate(ids, num_samples=samples, max_new_tokens=new_tokens, seed=r)
            rates[name].append(batch.num_generated_tokens / batch.gen_seconds)
    return {k: statistics.median(v) for k, v in rates.items()} | {"rates": rates}


def bench_vllm_generate(prompts: int, samples: int, new_tokens: int, rounds: int) -> dict:
    from tepo.models import load_model_and_tokenizer
    from tepo.rollout.vllm import VLLMRollout

    model, tokenizer = load_model_and_tokenizer(None)
    ids = _prompts(tokenizer, prompts)
    rates = {"float32": [], "bf16": []}
    for r in range(rounds):
        for name in ("float32", "bf16") if r % 2 == 0 else ("bf16", "float32"):
            dtype = "bfloat16" if name == "bf16" else "float32"
            with VLLMRollout(model, tokenizer, dtype=dtype, seed=0) as engine:
                engine.generate(ids[:1], num_samples=2, max_new_tokens=8, seed=0)  # warm-up
                batch = engine.generate(ids, num_samples=samples, max_new_tokens=new_tokens, seed=r)
                rates[name].append(batch.num_generated_tokens / batch.gen_seconds)
    return {k: statistics.median(v) for k, v in rates.items()} | {"rates": rates}


def table(results: dict, picks: dict) -> str:
    lines = [
        "| part | float32 tokens/s | bf16 tokens/s | bf16 / float32 | faster | `auto` picks | `auto` picked the faster |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, label, setting in (
        ("forward_backward", "forward+backward (update)", "model.autocast_bf16"),
        ("hf_generate", "HF generate", "rollout.autocast_bf16"),
        ("vllm_generate", "vLLM generate", "rollout.vllm.dtype"),
    ):
        r = results.get(part)
        if r is None:
            lines.append(f"| {label} | - | - | - | - | {picks[setting]} | not measured |")
            continue
        faster = "bf16" if r["bf16"] > r["float32"] else "float32"
        picked = "bf16" if picks[setting] in (True, "bfloat16") else "float32"
        lines.append(
            f"| {label} | {r['float32']:.0f} | {r['bf16']:.0f} | {r['bf16'] / r['float32']:.2f} | {faster} "
            f"| {picks[setting]} ({picked}) | {'yes' if picked == faster else 'no'} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="A/B alternations per part (medians over them)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--skip-vllm", action="store_true", help="HF passes only")
    parser.add_argument("--out", help="folder for <cpu-kind>.md and <cpu-kind>.json")
    return parser


def run_parts(args) -> dict:
    """Forward+backward, HF generate and (where installed and not skipped) vLLM generate, float32 against bf16."""
    from tepo.config import RolloutConfig
    from tepo.rollout.registry import rollout_backend_class

    results = {}
    print(f"forward+backward, {args.rows} x {args.tokens} tokens ...", flush=True)
    results["forward_backward"] = bench_forward_backward(args.rows, args.tokens, args.rounds)
    rates = results["forward_backward"]
    print(f"  float32 {rates['float32']:.0f} tok/s, bf16 {rates['bf16']:.0f} tok/s", flush=True)
    workload = (args.prompts, args.samples, args.new_tokens, args.rounds)
    print(f"HF generate, {args.prompts} x {args.samples} x {args.new_tokens} tokens ...", flush=True)
    results["hf_generate"] = bench_hf_generate(*workload)
    rates = results["hf_generate"]
    print(f"  float32 {rates['float32']:.0f} tok/s, bf16 {rates['bf16']:.0f} tok/s", flush=True)
    vllm_ok, why = rollout_backend_class("vllm").availability(RolloutConfig())
    if args.skip_vllm or not vllm_ok:
        print(f"vLLM: skipped ({'--skip-vllm' if args.skip_vllm else why})", flush=True)
    else:
        print("vLLM generate (an engine per precision and round) ...", flush=True)
        results["vllm_generate"] = bench_vllm_generate(*workload)
    return results


def write_report(
    out: Path, args, command: str, machine: dict, precision, picks: dict, results: dict, text: str
):
    """``<cpu-kind>.md`` (the table with how it was made) and ``<cpu-kind>.json`` (everything) in ``out``."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    kind = cpu_kind(machine)
    (out / f"{kind}.md").write_text(
        f"# float32 vs bf16 on {machine['cpu_model']} ({kind})\n\n"
        f"Made by `{command.strip()}` on {time.strftime('%Y-%m-%d')}: 2 cores shared with other jobs "
        f"(load average at end {load_average()[0]:.1f}); medians of {args.rounds} alternating rounds.\n\n"
        f"CPU flags that matter: {' '.join(machine['cpu_flags'])}. torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads.\n\n"
        f"`auto` here: {precision.banner()}\n\n{text}\n\n"
        f"Workloads: forward+backward {args.rows} x {args.tokens} tokens of the embedded model (activation "
        f"checkpointing, as the trainer); generation {args.prompts} prompts x {args.samples} samples x up to "
        f"{args.new_tokens} new tokens, temperature 1.\n"
    )
    (out / f"{kind}.json").write_text(
        json.dumps({"machine": machine, "picks": picks, "results": results, "args": vars(args)}, indent=2)
        + "\n"
    )
    print(f"wrote {out / (kind + '.md')} and .json")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)

    import torch

    from tepo.precision import resolve_precision

    machine = machine_precision("cpu")
    precision, _ = resolve_precision("auto", "auto", "auto", "cpu")
    picks = {
        "model.autocast_bf16": precision.model_autocast_bf16,
        "rollout.autocast_bf16": precision.rollout_autocast_bf16,
        "rollout.vllm.dtype": precision.vllm_dtype,
    }
    print(precision_line(machine), flush=True)
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads; load average {load_average()}", flush=True)
    started = time.perf_counter()
    results = run_parts(args)
    seconds = time.perf_counter() - started
    text = table(results, picks)
    print()
    print(text)
    print(f"\n{seconds:.0f} s; load average at end {load_average()}")
    if args.out:
        command = "python benchmarks/bench_precision.py " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        write_report(Path(args.out), args, command, machine, precision, picks, results, text)


if __name__ == "__main__":
    main()
