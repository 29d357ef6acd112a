"""The update phase alone, fixed-row against token-budget micro-batches (issue #38), on the embedded model.

    .venv/bin/python benchmarks/bench_micro_batches.py --rows 64 --max-new 1024 --budgets none,4096 --rounds 2 --threads 1

One synthetic batch per run (seeded): prompt lengths uniform in [80, 160] (GSM8K prompts with the chat template),
response lengths exponential with mean ``--mean-len`` capped at ``--max-new`` (the capped rows are the truncated
ones). The default means follow the generated tokens of docs/results/scaling at 16 x 8 (157 per row at 256 new
tokens, 360 at 1024): mean 235 at 256, 400 at 1024. Each layout runs ``update_policy`` once per round in a fresh
process (its peak RSS is its own), the layouts alternating so that both see the same load; bf16 autocast where
``auto`` picks it, activation checkpointing and the attention ``auto`` picks, as a default run. Reported per
layout: update seconds and tokens/s (median over rounds), the share of computed tokens that are padding, peak RSS.
The padding share alone is also printed for larger shapes, from the same length model (no model run needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time


def synthetic_lengths(rows: int, max_new: int, mean_len: float, seed: int) -> tuple[list[int], list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(80, 161, (rows,), generator=gen)
    response = (-mean_len * torch.log1p(-torch.rand(rows, generator=gen))).ceil().clamp(1, max_new).long()
    return prompt.tolist(), response.tolist()


def build_batch(prompt: list[int], response: list[int], group: int, vocab: int):
    import torch

    from tepo.rollout.base import RolloutBatch

    n, width_p, width_r = len(prompt), max(prompt), max(response)
    gen = torch.Generator().manual_seed(0)
    p_len, r_len = torch.tensor(prompt), torch.tensor(response)
    p_mask = torch.arange(width_p)[None] >= (width_p - p_len)[:, None]
    r_mask = torch.arange(width_r)[None] < r_len[:, None]
    ids = torch.randint(10, vocab, (n, width_p + width_r), generator=gen)
    # A group's rows share their prompt (the share_prompt_prefix pass needs equal prompt columns).
    ids[:, :width_p] = ids[::group, :width_p].repeat_interleave(group, 0)[:n]
    group_prompt = p_mask[::group].repeat_interleave(group, 0)[:n]
    att = torch.cat([group_prompt, r_mask], 1).long()
    return RolloutBatch(
        input_ids=ids * att,
        attention_mask=att,
        response_mask=r_mask.float(),
        response_len=width_r,
        prompt_index=torch.arange(n) // group,
        texts=[""] * n,
        truncated=r_len >= width_r,
        gen_seconds=0.0,
        num_generated_tokens=int(r_mask.sum()),
    )


def worker(args) -> dict:
    import torch

    from tepo.config import load_config
    from tepo.models import load_model_and_tokenizer
    from tepo.precision import native_bf16
    from tepo.training.logprob_pass import LogprobSettings
    from tepo.training.micro_batches import RowLengths, split_rows
    from tepo.training.plan import UpdatePlan, UpdateSettings
    from tepo.training.setup import enable_activation_checkpointing
    from tepo.training.update import RowTensors, update_policy

    torch.set_num_threads(args.threads)
    config = load_config("default", [])
    model, tokenizer = load_model_and_tokenizer(None)
    if config.model.gradient_checkpointing:
        enable_activation_checkpointing(model)
    model.train()
    prompt, response = synthetic_lengths(args.rows, args.max_new, args.mean_len, args.seed)
    # Group the prompts as rollouts do: G rows per prompt (prompt lengths per group).
    prompt = [prompt[(i // args.group) * args.group] for i in range(len(prompt))]
    batch = build_batch(prompt, response, args.group, len(tokenizer))
    budget = None if args.layout == "none" else int(args.layout)
    passes = LogprobSettings(
        micro_batch_size=args.micro,
        temperature=1.0,
        autocast_bf16=native_bf16("cpu").native,  # what model.autocast_bf16=auto picks here
        share_prompt_prefix=config.model.share_prompt_prefix,
        train_attention=config.model.train_attention,
        micro_batch_tokens=budget,
    )
    settings = UpdateSettings("tepo", {}, 1, args.rows // args.group, args.group, 1.0, float(args.max_new))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _u: 1.0)
    tensors = RowTensors(advantages=torch.linspace(-1, 1, args.rows), mask=batch.response_mask)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    out = update_policy(
        model, optimizer, scheduler, batch, tensors, UpdatePlan(settings, passes), generator=torch.Generator()
    )
    seconds = time.perf_counter() - start
    lengths = RowLengths.of(batch)
    micro = split_rows(torch.arange(args.rows), passes.layout, lengths)
    return {
        "layout": args.layout,
        "update_seconds": seconds,
        "response_tokens": int(batch.response_mask.sum()),
        "update_tokens_per_s": float(batch.response_mask.sum()) / seconds,
        "padding_share": out["update/padding_share"],
        "micro_batches": len(micro),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_update_mb": before,
        "loss": out["update/loss"],
        "autocast_bf16": passes.autocast_bf16,
    }


def padding_table(shapes, budgets, micro: int, seed: int) -> list[str]:
    """Padding share of fixed-row and token-budget layouts from the length model alone."""
    import torch

    from tepo.training.micro_batches import MicroBatchLayout, RowLengths, split_rows

    lines = [
        "| rows | max new | mean len | layout | micro-batches | padding share |",
        "|---|---|---|---|---|---|",
    ]
    for rows, max_new, mean_len in shapes:
        prompt, response = synthetic_lengths(rows, max_new, mean_len, seed)
        prompt = [prompt[(i // 8) * 8] for i in range(rows)]
        lengths = RowLengths(torch.tensor(prompt), torch.tensor(response))
        for budget in budgets:
            layout = MicroBatchLayout(micro, None if budget == "none" else int(budget))
            parts = split_rows(torch.arange(rows), layout, lengths)
            computed, real = lengths.padded_tokens(parts)
            lines.append(
                f"| {rows} | {max_new} | {mean_len:g} | {budget} | {len(parts)} | {1 - real / computed:.3f} |"
            )
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=256)
    parser.add_argument("--mean-len", type=float, default=None, help="default: 235 at <= 256, else 400")
    parser.add_argument(
        "--micro", type=int, default=16, help="train.micro_batch_size (the fixed layout's rows)"
    )
    parser.add_argument(
        "--budgets", default="none,4096", help="comma list: none (fixed rows) or a token budget"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layout", help=argparse.SUPPRESS)  # worker mode
    args = parser.parse_args(argv)
    if args.mean_len is None:
        args.mean_len = 235.0 if args.max_new <= 256 else 400.0
    if args.layout is not None:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return
    budgets = [b.strip() for b in args.budgets.split(",")]
    print(
        "\n".join(padding_table([(128, 256, 235.0), (128, 1024, 400.0), (128, 2048, 600.0)], budgets, 16, 0))
    )
    results = {b: [] for b in budgets}
    for round_index in range(args.rounds):
        for budget in budgets if round_index % 2 == 0 else budgets[::-1]:
            load = os.getloadavg()[0]
            cmd = [sys.executable, __file__, "--layout", budget]
            cmd += [
                f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("rows", "group", "max_new", "micro")
            ]
            cmd += [f"--mean-len={args.mean_len}", f"--threads={args.threads}", f"--seed={args.seed}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(proc.stderr[-3000:])
            entry = json.loads(line[7:]) | {"load_avg": float(load)}
            results[budget].append(entry)
            print(json.dumps(entry), flush=True)
    print(
        "\n| layout | micro-batches | update s | update tokens/s | padding share | peak RSS MiB | load avg |"
    )
    print("|---|---|---|---|---|---|---|")
    for budget, entries in results.items():

        def med(key, entries=entries):
            return statistics.median(e[key] for e in entries)

        print(
            f"| {budget} | {entries[0]['micro_batches']} | {med('update_seconds'):.1f} "
            f"| {med('update_tokens_per_s'):.0f} | {entries[0]['padding_share']:.3f} | {med('peak_rss_mb'):.0f} "
            f"| {med('load_avg'):.1f} |"
        )
    assert all(math.isfinite(e["loss"]) for entries in results.values() for e in entries)


if __name__ == "__main__":
    main()
