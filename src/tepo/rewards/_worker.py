"""Reward worker process: reads one JSON item per line on stdin, writes one JSON result per line on stdout.

Started by ``MathRewardPool`` as ``python _worker.py`` (a fresh interpreter: no fork of a parent that may hold
torch threads, and no re-import of the parent's ``__main__``). Only strings and plain results cross the pipe, as
JSON; nothing is pickled or evaluated.

Protection layers inside the worker (the parent adds a hard deadline and kills us on overrun):
- ``RLIMIT_AS`` caps our address space, so a memory bomb raises MemoryError here instead of swapping the host;
  after a MemoryError the interpreter state is suspect, so we report the item as an error and exit.
- A SIGALRM timer (``setitimer``, sub-second resolution) in this main thread interrupts sympy at the soft
  deadline, which ends almost every hostile item without the cost of a respawn. math-verify's own
  ``signal.alarm`` timeouts are switched off because they would re-arm the same timer.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import time

if __package__:
    from . import answers
else:  # run as a script: sys.path[0] is this directory; do not import the tepo package (it may import torch)
    import answers

    del sys.path[0]


class SoftTimeout(BaseException):
    """Raised by the SIGALRM handler; a BaseException so that sympy's and math-verify's ``except Exception``
    clauses cannot swallow it."""


_armed = False


def _on_alarm(signum, frame):
    if _armed:
        raise SoftTimeout()


def _set_memory_limit(limit_mb: int) -> None:
    if limit_mb > 0:
        limit = limit_mb << 20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def score_message(msg: dict, gold_cache: dict) -> dict:
    """Score one decoded request under its soft deadline; always returns a result dict."""
    global _armed
    fatal = False
    try:
        try:
            _armed = True
            signal.setitimer(signal.ITIMER_REAL, max(float(msg["soft_deadline_s"]), 0.001))
            result = answers.verify_item(
                msg["gold"], msg["response"], msg["format"], msg["max_chars"], gold_cache=gold_cache
            )
        finally:
            _armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    except SoftTimeout:
        result = {"status": "timeout", "detail": "soft deadline in worker"}
    except MemoryError:
        result = {"status": "error", "detail": "MemoryError in worker (memory limit reached)"}
        fatal = True
    except RecursionError:
        result = {"status": "error", "detail": "RecursionError in worker"}
    except Exception as e:  # a verifier bug must cost one item, not the worker
        result = {"status": "error", "detail": f"{type(e).__name__} in worker"}
    result["id"] = msg["id"]
    result["fatal"] = fatal
    return result


def main() -> None:
    limit_mb = int(os.environ.get("TEPO_REWARD_WORKER_MEMORY_MB", "0"))
    t0 = time.perf_counter()
    # Our protocol owns the real stdout; anything a library prints goes to stderr (a log file the parent keeps).
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is for the parent to handle
    # math-verify logs the offending input on failures; model output does not belong in logs.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)
    gold_cache: dict = {}
    answers.verify_item("\\frac{1}{2}", "so \\boxed{0.5}", "boxed")  # import and warm up before the limit
    _set_memory_limit(limit_mb)
    out.write(json.dumps({"ready": True, "pid": os.getpid(), "startup_s": time.perf_counter() - t0}).encode())
    out.write(b"\n")
    for line in sys.stdin.buffer:
        msg = json.loads(line)
        result = score_message(msg, gold_cache)
        out.write(json.dumps(result).encode() + b"\n")
        if result["fatal"]:
            os._exit(3)


if __name__ == "__main__":
    main()
