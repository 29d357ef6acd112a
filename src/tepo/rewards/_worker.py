"""Reward worker process: reads one JSON item per line on stdin, writes one JSON result per line on stdout.

Started by ``RewardPool`` (``sandbox.py``) as ``python _worker.py`` (a fresh interpreter: no fork of a parent that may hold
torch threads, and no re-import of the parent's ``__main__``). Only strings and plain results cross the pipe, as
JSON; nothing is pickled or evaluated.

Two kinds of item: a math-verify verification (``answers.verify_item``), and (``"task": "call"``) a call of
one of the user's reward functions (``user_functions.py``), which this process imports itself, by path or
module name, at start-up from ``TEPO_REWARD_FUNCTIONS`` (a JSON list of ``{label, path, name}``), before its
memory limit. Both run under the same deadlines, so a user's function that hangs or raises costs its item
only.

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
import traceback

if __package__:
    from . import answers, user_functions
else:  # run as a script: sys.path[0] is this directory; do not import the tepo package (it may import torch)
    import answers
    import user_functions

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


def verify_message(msg: dict, gold_cache: dict) -> dict:
    return answers.verify_item(
        msg["gold"], msg["response"], msg["format"], msg["max_chars"], gold_cache=gold_cache
    )


def call_message(msg: dict, functions: dict) -> dict:
    """A user's reward function on one response (verl form) or one batch (TRL form): ``"scored"`` with its
    ``value`` (or ``values`` and the indices of its ``element_errors``), or ``"error"`` with the reason in one
    line."""
    kind, function = functions[msg["label"]]
    try:
        if kind == "verl":
            return {"status": "scored", "value": user_functions.call_verl(function, msg["arguments"])}
        values, element_errors, reason = user_functions.call_trl(function, msg["arguments"])
        return {"status": "scored", "values": values, "element_errors": element_errors, "detail": reason}
    except user_functions.RewardFunctionError as err:
        return {"status": "error", "detail": str(err)}
    except (MemoryError, RecursionError):
        raise
    except (
        Exception
    ) as err:  # the user's code raised: its type, message and line, and the traceback in the log
        traceback.print_exc(file=sys.stderr)
        frame = traceback.extract_tb(err.__traceback__)[-1]
        where = f" ({os.path.basename(frame.filename)} line {frame.lineno})"
        return {"status": "error", "detail": f"raised {type(err).__name__}: {str(err)[:300]}{where}"}


def score_message(msg: dict, gold_cache: dict, functions: dict | None = None) -> dict:
    """Score one decoded request under its soft deadline; always returns a result dict."""
    global _armed
    fatal = False
    try:
        try:
            _armed = True
            signal.setitimer(signal.ITIMER_REAL, max(float(msg["soft_deadline_s"]), 0.001))
            if msg.get("task") == "call":
                result = call_message(msg, functions or {})
            else:
                result = verify_message(msg, gold_cache)
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
    except (
        Exception
    ) as e:  # a verifier bug or a user's function that raises must cost one item, not the worker
        result = {"status": "error", "detail": f"{type(e).__name__} in worker: {str(e)[:200]}"}
    result["id"] = msg["id"]
    result["fatal"] = fatal
    return result


def load_user_functions() -> dict:
    """``{label: (kind, function)}`` of ``TEPO_REWARD_FUNCTIONS``."""
    specs = json.loads(os.environ.get("TEPO_REWARD_FUNCTIONS") or "[]")
    functions = {}
    for spec in specs:
        function = user_functions.load_function(spec["path"], spec["name"])
        functions[spec["label"]] = (user_functions.function_kind(function), function)
    return functions


def main() -> None:
    limit_mb = int(os.environ.get("TEPO_REWARD_WORKER_MEMORY_MB", "0"))
    t0 = time.perf_counter()
    # Our protocol owns the real stdout; anything a library prints goes to stderr (a log file the parent keeps).
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # a user's prints reach the log even if we are killed
    # Likewise the protocol owns stdin: a user's reward function that reads input gets an empty file instead.
    requests = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is for the parent to handle
    # math-verify logs the offending input on failures; model output does not belong in logs.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.CRITICAL)
    gold_cache: dict = {}
    answers.verify_item("\\frac{1}{2}", "so \\boxed{0.5}", "boxed")  # import and warm up before the limit
    try:
        functions = load_user_functions()
    except user_functions.RewardFunctionError as err:
        print(f"reward function: {err}", file=sys.stderr)
        sys.exit(2)
    _set_memory_limit(limit_mb)
    kinds = {label: kind for label, (kind, _) in functions.items()}
    ready = {"ready": True, "pid": os.getpid(), "startup_s": time.perf_counter() - t0, "kinds": kinds}
    out.write(json.dumps(ready).encode())
    out.write(b"\n")
    for line in requests:
        msg = json.loads(line)
        result = score_message(msg, gold_cache, functions)
        out.write(json.dumps(result).encode() + b"\n")
        if result["fatal"]:
            os._exit(3)


if __name__ == "__main__":
    main()
