"""Where the update stands against this CPU's own forward + backward rate at the same shapes (issue #54, item 3).

    .venv/bin/python benchmarks/bench_update_floor.py                 # the default run's shapes, 3 rounds
    .venv/bin/python benchmarks/bench_update_floor.py --max-new 256 --mean-len 150

One process, one synthetic batch shaped like the default run's (``--rows`` rows in groups of 8, arithmetic-like
prompt lengths, exponential response lengths capped at ``--max-new``; bench_micro_batches.py's length model), and
two ways of spending it, alternating per round after a warm-up of each:

- **update**: tepo's ``update_policy`` as a default run calls it (bf16 autocast where ``auto`` picks it,
  activation checkpointing, the shared prompt pass, chunked log-probs, fused AdamW step);
- **update_no_ckpt**: the same without activation checkpointing (``model.gradient_checkpointing=false``): what
  the recomputation costs at these shapes;
- **floor**: the plainest forward + backward of the same model over the same micro-batches, padded the same way
  (``model(ids).logits`` → log-softmax → the response tokens' log-probs summed → ``backward``; no checkpointing,
  no optimizer step). This is what the hardware does with these shapes without any of tepo's choices.

Printed: the seconds of each (median over rounds), their ratio, the rate of each in model FLOPs (6 × parameters ×
real tokens, the usual forward + backward count) per second, and each against the **matmul bound**: those FLOPs at
the rate this CPU's warmed dense matmuls reach at the micro-batch's shapes (the update's time if everything but
its matmuls were free). The ratios are the figures to read: on a noisy machine all sides see the same load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_micro_batches import build_batch, synthetic_lengths


def floor_pass(model, batch, micro: int, autocast: bool) -> None:
    """Forward + backward of every micro-batch of ``batch``, padded to its own longest row; no optimizer step."""
    import torch

    width_p = batch.input_ids.shape[1] - batch.response_len
    for start in range(0, batch.input_ids.shape[0], micro):
        rows = slice(start, start + micro)
        ids, mask = batch.input_ids[rows], batch.response_mask[rows]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids, attention_mask=batch.attention_mask[rows]).logits
        logp = logits[:, width_p - 1 : -1].float().log_softmax(-1)
        picked = logp.gather(-1, ids[:, width_p:, None])[..., 0]
        (-(picked * mask).sum() / mask.sum()).backward()
    model.zero_grad(set_to_none=True)


def matmul_rate(tokens: int, dtype_name: str, threads: int) -> float:
    """FLOP/s of this CPU's dense matmuls at the update's shapes: ``tokens`` rows through the model's four layer
    projections (hidden 576 -> 960, 576 -> 576, 576 -> 3072, 1536 -> 576), warmed, in ``dtype_name``. The
    rate an update could reach if everything but its matmuls were free."""
    import torch

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    shapes = [(576, 960), (576, 576), (576, 3072), (1536, 576)]
    weights = [torch.randn(n, k, dtype=dtype) for k, n in shapes]
    inputs = [torch.randn(tokens, k, dtype=dtype) for k, _ in shapes]
    for x, w in zip(inputs, weights):
        torch.nn.functional.linear(x, w)
    start = time.perf_counter()
    for _ in range(5):
        for x, w in zip(inputs, weights):
            torch.nn.functional.linear(x, w)
    seconds = (time.perf_counter() - start) / 5
    return sum(2 * tokens * k * n for k, n in shapes) / seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=64)
    parser.add_argument("--mean-len", type=float, default=40.0, help="mean response length before the cap")
    parser.add_argument("--micro", type=int, default=16, help="train.micro_batch_size")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def build_sides(args, autocast: bool):
    """The three timed sides on one synthetic batch (tepo's update with and without activation checkpointing, and
    the plainest forward + backward), the batch, and the floor's model."""
    import torch

    from tepo.config import load_config
    from tepo.models import load_model_and_tokenizer
    from tepo.training.logprob_pass import LogprobSettings
    from tepo.training.plan import UpdatePlan, UpdateSettings
    from tepo.training.setup import enable_activation_checkpointing
    from tepo.training.update import RowTensors, update_policy

    config = load_config("default", [])
    model, tokenizer = load_model_and_tokenizer(None)
    plain, _ = load_model_and_tokenizer(None)  # the floor's model: no checkpointing
    unchecked, _ = load_model_and_tokenizer(None)  # update_no_ckpt's
    enable_activation_checkpointing(model)
    model.train(), plain.train(), unchecked.train()
    _, response = synthetic_lengths(args.rows, args.max_new, args.mean_len, 0)
    # Chat-templated arithmetic prompts are 50-56 tokens; one length per group.
    prompt = [52 + (i // args.group) % 5 for i in range(args.rows)]
    batch = build_batch(prompt, response, args.group, len(tokenizer))
    passes = LogprobSettings(
        micro_batch_size=args.micro,
        temperature=1.0,
        autocast_bf16=autocast,
        share_prompt_prefix=config.model.share_prompt_prefix,
        train_attention=config.model.train_attention,
        micro_batch_tokens=None,
    )
    settings = UpdateSettings("tepo", {}, 1, args.rows // args.group, args.group, 1.0, float(args.max_new))
    tensors = RowTensors(advantages=torch.linspace(-1, 1, args.rows), mask=batch.response_mask)

    def updater(policy):
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-9, fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _u: 1.0)
        plan = UpdatePlan(settings, passes)
        return lambda: update_policy(
            policy, optimizer, scheduler, batch, tensors, plan, generator=torch.Generator()
        )

    def floor() -> None:
        floor_pass(plain, batch, args.micro, autocast)

    return {"update": updater(model), "update_no_ckpt": updater(unchecked), "floor": floor}, batch, plain


def time_sides(sides: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each side per round, after one warm-up call each; the order is reversed every other round."""
    for fn in sides.values():
        fn()  # warm-up: allocator, oneDNN kernels, autocast caches
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for round_index in range(rounds):
        for name in sides if round_index % 2 == 0 else list(sides)[::-1]:
            start = time.perf_counter()
            sides[name]()
            seconds[name].append(time.perf_counter() - start)
            print(f"round {round_index + 1} {name}: {seconds[name][-1]:.2f} s", flush=True)
    return seconds


def print_report(args, seconds: dict[str, list[float]], batch, plain, autocast: bool) -> None:
    params = sum(p.numel() for p in plain.parameters())
    computed = batch.input_ids.shape[0] * batch.input_ids.shape[1]
    real = int(batch.attention_mask.sum())
    print(
        f"\n{args.rows} rows, {computed} computed tokens ({real} real), {params / 1e6:.0f}M parameters, "
        f"bf16 autocast {autocast}, {args.threads} threads"
    )
    rate = matmul_rate(
        args.micro * batch.input_ids.shape[1], "bfloat16" if autocast else "float32", args.threads
    )
    bound = 6 * params * real / rate
    print(
        f"matmul rate at these shapes: {rate / 1e9:.0f} GFLOP/s; 6 N x real tokens at that rate: {bound:.2f} s"
    )
    print(
        "| side | seconds (median) | model GFLOP/s (6 N real tokens / s) | / plain fwd+bwd | / matmul bound |"
    )
    print("|---|---|---|---|---|")
    floor_s = statistics.median(seconds["floor"])
    for name, values in seconds.items():
        median = statistics.median(values)
        print(
            f"| {name} | {median:.2f} | {6 * params * real / median / 1e9:.0f} | {median / floor_s:.2f} "
            f"| {median / bound:.2f} |"
        )


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)

    import torch

    from tepo.precision import native_bf16

    torch.set_num_threads(args.threads)
    autocast = native_bf16("cpu").native  # what model.autocast_bf16=auto picks here
    sides, batch, plain = build_sides(args, autocast)
    seconds = time_sides(sides, args.rounds)
    print_report(args, seconds, batch, plain, autocast)


if __name__ == "__main__":
    main()
