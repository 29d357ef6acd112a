"""Peak memory and time of chunked vs naive response log-probs + entropy, forward and backward.

Each variant runs in a fresh subprocess with the real embedded model (vocabulary 49,152). Peak resident memory
is read from ``/proc/self/status`` (``VmHWM``), reset just before the measured step by writing ``5`` to
``/proc/self/clear_refs``, so model loading does not count; where that reset is not allowed, the reported peak
falls back to ``ru_maxrss`` minus the resident size before the step. (tracemalloc does not see torch's allocator.)

    .venv/bin/python benchmarks/bench_logprobs.py                 # N=16, T=512 response tokens, P=32 prompt
    .venv/bin/python benchmarks/bench_logprobs.py --rows 4 --response-len 128   # quick

``naive`` is the usual computation: ``lm_head`` on every response position at once, ``[N, T, V]`` float32
logits, ``log_softmax``, gather, entropy. ``chunked`` is :func:`tepo.logprobs.response_logprobs`. Both run the
same transformer body; ``--head-only`` computes the body's output once without a graph before the measured
step, to compare only the output layer (the body's activations otherwise dominate the peak).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def run_variant(args) -> dict:
    import gc

    import torch

    from tepo.logprobs import response_logprobs
    from tepo.models import load_model_and_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer()
    model.train()
    width = args.prompt_len + args.response_len
    ids = torch.randint(3, model.config.vocab_size, (args.rows, width))
    mask = torch.ones_like(ids)
    t = args.response_len

    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    body_kwargs = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}
    precomputed = None
    if args.head_only:  # body output computed once, before the measured step, without a graph
        with torch.no_grad():
            precomputed = model.model(**body_kwargs).last_hidden_state

    def body_output():
        if precomputed is not None:
            return precomputed.detach().requires_grad_()
        return model.model(**body_kwargs).last_hidden_state

    def naive():
        hidden = body_output()
        logits = model.lm_head(hidden[:, -t - 1 : -1]).float()
        log_probs = torch.log_softmax(logits, -1)
        logp = log_probs.gather(-1, ids[:, -t:].unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return logp, entropy

    class BodyOutput:
        def __init__(self):
            self.last_hidden_state = body_output()

    class Model(torch.nn.Module):
        """The embedded model as response_logprobs sees it, with the body swapped for ``body_output``."""

        def get_decoder(self):
            return lambda **_kw: BodyOutput()

        def get_output_embeddings(self):
            return model.lm_head

    def chunked():
        target = model if precomputed is None else Model()
        return response_logprobs(target, ids, mask, t, chunk_size=args.chunk_size)

    step = naive if args.variant == "naive" else chunked
    gc.collect()
    _malloc_trim()  # hand memory freed by loading/precomputing back to the OS, so RSS growth is real demand
    rss_before = _rss_mib("VmRSS")
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    reset = _reset_peak()
    start = time.perf_counter()
    logp, entropy = step()
    forward_s = time.perf_counter() - start
    (logp.sum() + 0.01 * entropy.sum()).backward()
    total_s = time.perf_counter() - start
    if reset:
        peak = _rss_mib("VmHWM")
    else:  # ru_maxrss only grows; meaningful only if the step's peak exceeds the loading peak
        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, maxrss_before)
    return {
        "variant": args.variant,
        "rss_before_mib": round(rss_before, 1),
        "peak_mib": round(peak, 1),
        "peak_over_before_mib": round(peak - rss_before, 1),
        "forward_s": round(forward_s, 2),
        "forward_backward_s": round(total_s, 2),
        "peak_reset": reset,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument(
        "--chunk-size", type=int, default=None, help="positions per chunk (default: library's)"
    )
    parser.add_argument(
        "--head-only", action="store_true", help="detach the body: measure the output layer only"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--variant", choices=["naive", "chunked"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.variant:  # child process: one measurement, JSON on the last line
        print(json.dumps(run_variant(args)))
        return

    results = {}
    passthrough = sys.argv[1:]
    for variant in ("chunked", "naive"):
        proc = subprocess.run(
            [sys.executable, __file__, *passthrough, "--variant", variant], capture_output=True, text=True
        )
        if proc.returncode != 0:
            sys.exit(f"{variant} failed:\n{proc.stderr[-3000:]}")
        results[variant] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps(results[variant]), flush=True)

    c, n = results["chunked"], results["naive"]
    shape = f"[{args.rows}, {args.response_len}] response tokens (+{args.prompt_len} prompt), vocab 49152"
    print(f"\n{shape}{', head only' if args.head_only else ''}, forward+backward")
    print(f"{'':10}{'peak RSS':>12}{'peak - before':>16}{'fwd s':>8}{'fwd+bwd s':>11}")
    for name, r in (("chunked", c), ("naive", n)):
        print(
            f"{name:10}{r['peak_mib']:>9.0f} MiB{r['peak_over_before_mib']:>12.0f} MiB"
            f"{r['forward_s']:>8.1f}{r['forward_backward_s']:>11.1f}"
        )
    print(
        f"naive/chunked: extra peak memory {n['peak_over_before_mib'] / max(c['peak_over_before_mib'], 1e-9):.2f}x, "
        f"time {n['forward_backward_s'] / c['forward_backward_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
