"""Does packing a micro-batch's rows into one sequence pay on this machine? (issue #38, item 2)

    .venv/bin/python benchmarks/bench_packing.py --rounds 3

The update's body (the embedded model's decoder, no vocabulary projection: tepo scores only real response
positions, so padding costs the body alone) runs forward + backward on the same rows two ways, alternating, in one
process:

- **padded**: ``[rows, longest]``, left-padded prompts and right-padded responses as tepo runs a micro-batch
  (trimmed to its own columns), attention mask as usual;
- **packed**: ``[1, sum of lengths]`` with per-row ``position_ids`` restarting at 0 and ``use_cache=False``;
  transformers (masking_utils ``find_packed_sequence_indices``) then keeps each token's attention inside its own
  row with a block-diagonal mask over the whole packed length.

Micro-batches come from the length model of ``bench_micro_batches.py`` (GSM8K-like prompts, exponential
responses at 1024 max new tokens): one of today's fixed 16-row micro-batches in rollout order (padding ~0.5), and
the first micro-batches of the sorted next-fit 4096- and 8192-token budgets (``train.micro_batch_tokens``; padding
~0.1). Before timing, the packed pass's hidden states and gradients are checked against the padded pass
(float32, eager) to show the packing is exact where it is timed. Precision: what ``auto`` picks here (bf16 autocast
with native bf16, else float32).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_micro_batches import synthetic_lengths


def padded_inputs(prompt: list[int], response: list[int], vocab: int, gen: torch.Generator):
    """Left-padded prompts + right-padded responses, as a trimmed tepo micro-batch."""
    n, wp, wr = len(prompt), max(prompt), max(response)
    p_len, r_len = torch.tensor(prompt), torch.tensor(response)
    att = torch.cat(
        [torch.arange(wp)[None] >= (wp - p_len)[:, None], torch.arange(wr)[None] < r_len[:, None]], 1
    ).long()
    ids = torch.randint(10, vocab, (n, wp + wr), generator=gen) * att
    return ids, att


def packed_inputs(ids: torch.Tensor, att: torch.Tensor):
    """The real tokens of every row, one after another, with positions restarting at 0 per row."""
    rows = [row[mask.bool()] for row, mask in zip(ids, att)]
    positions = torch.cat([torch.arange(len(r)) for r in rows])
    return torch.cat(rows)[None], positions[None]


def body_pass(model, ids, att=None, positions=None, autocast=False) -> tuple[float, torch.Tensor]:
    """Forward + backward of the decoder body; returns seconds and the (masked) hidden states."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if positions is None:
            # Positions as transformers derives them for left padding (what tepo.logprobs passes).
            pos = (att.cumsum(1) - 1).clamp(min=0)
            hidden = model.model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=False)[0]
            real = hidden[att.bool()]
        else:
            hidden = model.model(input_ids=ids, position_ids=positions, use_cache=False)[0]
            real = hidden[0]
    real.float().pow(2).mean().backward()
    return time.perf_counter() - start, real.detach().float()


def check_exact(model, prompt, response, vocab) -> tuple[float, float]:
    """Largest |hidden| and |grad| difference, packed against padded, in float32 (eager attention)."""
    gen = torch.Generator().manual_seed(1)
    ids, att = padded_inputs(prompt, response, vocab, gen)
    _, h_pad = body_pass(model, ids, att)
    g_pad = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    packed, positions = packed_inputs(ids, att)
    _, h_pack = body_pass(model, packed, positions=positions)
    g_pack = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    grad_gap = max(float((a - b).abs().max() / a.abs().max().clamp(min=1e-30)) for a, b in zip(g_pad, g_pack))
    return float((h_pad - h_pack).abs().max()), grad_gap


def micro_batches(max_new: int, mean_len: float) -> dict[str, tuple[list[int], list[int]]]:
    from tepo.training.micro_batches import MicroBatchLayout, RowLengths, split_rows

    prompt, response = synthetic_lengths(128, max_new, mean_len, 0)
    prompt = [prompt[(i // 8) * 8] for i in range(128)]
    lengths = RowLengths(torch.tensor(prompt), torch.tensor(response))
    out = {"16 rows, rollout order": (prompt[:16], response[:16])}
    for budget in (4096, 8192):
        first = split_rows(torch.arange(128), MicroBatchLayout(16, budget), lengths)[0].tolist()
        out[f"budget {budget}, first"] = ([prompt[i] for i in first], [response[i] for i in first])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new", type=int, default=1024)
    parser.add_argument("--mean-len", type=float, default=400.0)
    parser.add_argument(
        "--cases",
        default="rollout,4096,8192",
        help="comma list of micro-batches: rollout (16 rows in rollout order), 4096, 8192 (a sorted budget's first)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from _common import machine_precision

    from tepo.models import load_model_and_tokenizer
    from tepo.precision import native_bf16
    from tepo.training.setup import enable_activation_checkpointing

    autocast = native_bf16("cpu").native
    model, tokenizer = load_model_and_tokenizer(None)
    model.config._attn_implementation = "eager"
    # As a default run trains: activation checkpointing (model.gradient_checkpointing), so a packed micro-batch's
    # [L, L] attention is held for one layer at a time.
    enable_activation_checkpointing(model)
    model.train()
    vocab = len(tokenizer)
    names = {"rollout": "16 rows, rollout order", "4096": "budget 4096, first", "8192": "budget 8192, first"}
    every = micro_batches(args.max_new, args.mean_len)
    shapes = {names[c.strip()]: every[names[c.strip()]] for c in args.cases.split(",")}
    small = ([120, 95, 140], [30, 7, 18])
    hidden_gap, grad_gap = check_exact(model, *small, vocab)
    print(
        f"exactness (float32, eager, 3 rows): max |hidden| gap {hidden_gap:.2e}, max relative grad gap {grad_gap:.2e}"
    )
    # sdpa on both sides: what model.train_attention=auto picks past 512 columns, as a packed row is.
    model.config._attn_implementation = "sdpa"
    print(f"machine: {machine_precision()}; threads {args.threads}; load {os.getloadavg()[0]:.1f}")
    print(
        "| micro-batch | rows | real tokens | padded tokens | padding share | padded s | packed s | packed / padded "
        "| peak RSS MiB so far |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (prompt, response) in shapes.items():
        gen = torch.Generator().manual_seed(0)
        ids, att = padded_inputs(prompt, response, vocab, gen)
        packed, positions = packed_inputs(ids, att)
        times = {"padded": [], "packed": []}
        for r in range(args.rounds + 1):  # round 0 warms up
            for kind in ("padded", "packed") if r % 2 == 0 else ("packed", "padded"):
                if kind == "padded":
                    seconds, _ = body_pass(model, ids, att, autocast=autocast)
                else:
                    seconds, _ = body_pass(model, packed, positions=positions, autocast=autocast)
                if r:
                    times[kind].append(seconds)
        pad_s, pack_s = statistics.median(times["padded"]), statistics.median(times["packed"])
        real = int(att.sum())
        print(
            f"| {name} | {len(prompt)} | {real} | {att.numel()} | {1 - real / att.numel():.3f} | {pad_s:.2f} "
            f"| {pack_s:.2f} | {pack_s / pad_s:.2f} | {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
