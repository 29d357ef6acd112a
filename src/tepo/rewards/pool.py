"""``MathRewardPool``: verifiable math rewards from math-verify in worker processes with hard per-item timeouts.

Model output is untrusted. Each item is verified in a worker process (``_worker.py``). One dispatcher thread in
the parent hands items to idle workers, one at a time per worker, and enforces a hard deadline of ``timeout_s``
per item (from hand-off to that worker, not from ``submit``): a worker that overruns is killed (SIGKILL) and
replaced, and the item scores 0 with status ``"timeout"``. Inside the worker a softer SIGALRM deadline at
``soft_fraction * timeout_s`` interrupts sympy first, so most hostile items end without a respawn.

Failures: a MemoryError under the worker's ``RLIMIT_AS`` cap is reported by the worker as ``"error"``, after
which it exits and is replaced. A worker that dies outright (segfault, killed) gets its item retried once on a
fresh worker, since a death is not always the item's doing (e.g. a worker that died while idle just as it was
handed an item); a second death scores ``"error"``. Such an item may take two timeouts plus a start-up.

Start method: workers are fresh interpreters started with ``subprocess`` (fork+exec, like multiprocessing's
"spawn"), not ``multiprocessing``: nothing is forked from a parent that holds torch threads, the parent's
``__main__`` is not re-imported (scripts need no ``if __name__ == "__main__"`` guard), and only JSON lines cross
the pipes (nothing is pickled). A worker's start-up is its math-verify import and a warm-up verification.

Reward functions of the user's own (``functions``: ``{label, path, name}`` mappings, ``user_functions.py``)
are imported by every worker at start-up and called through ``submit_calls`` under the same deadlines: a
call that raises, returns a non-number or hangs scores 0 with status ``"error"`` or ``"timeout"``; one that
returns scores ``"scored"`` with its value. These calls are counted apart from the math verifications
(``calls``...).

Completions lose their trailer (padding, end-of-text markers) and are then cut to their last ``max_chars``
characters in the parent before anything is sent, so a worker never gets more than ``max_chars`` characters (see
``answers.py``); lone surrogates and control characters are replaced (see ``sanitize``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from .answers import ANSWER_FORMATS, DEFAULT_MAX_CHARS, tail

STATUSES = ("correct", "wrong", "no_answer", "timeout", "error")
CALL_STATUSES = ("scored", "timeout", "error")  # of a call of a user's reward function
_WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
# Lone surrogates (invalid UTF-8 decoded with "surrogateescape") become U+FFFD so results stay writable as UTF-8;
# C0 control characters other than tab/newline/CR, and DEL, mean nothing in LaTeX and become spaces.
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def sanitize(text: str, max_chars: int) -> str:
    """What the worker gets: at most ``max_chars`` characters, the last ones before the trailer (``tail``), with
    lone surrogates and control characters replaced."""
    return _CONTROL.sub(" ", _LONE_SURROGATE.sub("\ufffd", tail(text, max_chars)))


@dataclass(frozen=True)
class RewardResult:
    """Outcome of one completion. ``reward`` is 1.0 for ``"correct"`` and 0.0 for every other status.

    ``seconds``: wall time from hand-off to a worker until the result (queueing excluded).
    ``detail``: why, for ``"timeout"`` and ``"error"`` (empty otherwise).
    A call of a user's reward function (``submit_calls``) has status ``"scored"`` and its value as ``reward``;
    a batched (TRL-form) call has its values in ``values`` and the indices of those that were errors (scored
    0) in ``element_errors`` (``values`` is empty when the call failed as a whole).
    """

    reward: float
    status: str
    extracted: str | None
    seconds: float
    detail: str = ""
    values: tuple[float, ...] = ()
    element_errors: tuple[int, ...] = ()


@dataclass
class RewardStats:
    """Cumulative counters of a pool. ``timeouts`` counts both soft (in-worker) and hard (killed) timeouts;
    ``parse_failures``: an answer was extracted but math-verify could not make a sympy object of it."""

    items: int = 0
    correct: int = 0
    wrong: int = 0
    no_answer: int = 0
    timeouts: int = 0
    hard_timeouts: int = 0
    parse_failures: int = 0
    worker_restarts: int = 0
    errors: int = 0
    calls: int = 0  # calls of user reward functions, and how many of them timed out or failed
    call_timeouts: int = 0
    call_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class RewardFuture:
    """Results of one ``submit``; ``result()`` blocks until every item is scored."""

    def __init__(self, n: int):
        self._results: list[RewardResult | None] = [None] * n
        self._remaining = n
        self._done = threading.Event()
        self._error: BaseException | None = None
        if n == 0:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list[RewardResult]:
        if not self._done.wait(timeout):
            raise TimeoutError(f"reward results not ready after {timeout} s")
        if self._error is not None:
            raise self._error
        return list(self._results)  # type: ignore[arg-type]

    def _set(self, index: int, result: RewardResult) -> None:
        self._results[index] = result
        self._remaining -= 1
        if self._remaining == 0:
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()


@dataclass
class _Item:
    future: RewardFuture
    index: int
    payload: dict  # the request's JSON fields but its id and deadline (strings already sanitized)
    attempts: int = 0

    @property
    def is_call(self) -> bool:
        return self.payload.get("task") == "call"


class _Worker:
    """One worker process and the parent's view of it."""

    def __init__(self, memory_limit_mb: int, functions_json: str = "[]"):
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker; the worker's stderr: kept for error details, never printed
        env = dict(
            os.environ,
            TEPO_REWARD_WORKER_MEMORY_MB=str(memory_limit_mb),
            TEPO_REWARD_FUNCTIONS=functions_json,
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", str(_WORKER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            bufsize=0,
        )
        self.fd = self.proc.stdout.fileno()
        self.buffer = b""
        self.ready = False
        self.started = time.monotonic()
        self.startup_s: float | None = None
        self.item: _Item | None = None
        self.item_id = -1
        self.item_start = 0.0
        self.deadline = float("inf")

    def send(self, payload: bytes) -> None:
        self.proc.stdin.write(payload)  # unbuffered, blocking; the worker is idle and reading

    def stderr_tail(self, n: int = 400) -> str:
        try:
            self.log.seek(0, os.SEEK_END)
            size = self.log.tell()
            self.log.seek(max(0, size - n))
            return self.log.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.log):
            with contextlib.suppress(OSError):
                f.close()


_open_pools: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    for pool in list(_open_pools):
        pool.close()


class MathRewardPool:
    """Verifiable 0/1 math rewards with math-verify, safe against hostile completions.

    Args:
        num_workers: worker processes (each about 60-150 MB resident).
        timeout_s: hard limit per item, from hand-off to a worker until its result; the worker is killed and
            replaced on overrun and the item scores 0 (``"timeout"``).
        answer_format: one of ``ANSWER_FORMATS`` (see ``tepo.rewards.answers``).
        max_chars: only the last ``max_chars`` characters of a completion are verified.
        memory_limit_mb: ``RLIMIT_AS`` of each worker (0: no limit). The default leaves a wide margin over
            normal sympy use (about 70 MB virtual after warm-up, under 200 MB on megabyte inputs).
        soft_fraction: the in-worker SIGALRM deadline as a fraction of ``timeout_s``.
        startup_timeout_s: how long a new worker may take to import math-verify and report ready.
        functions: the user's reward functions, ``{label, path, name}`` mappings, each imported by every
            worker at start-up (``path`` a ``.py`` file or a module name; ``submit_calls`` names a ``label``).

    Use as a context manager or call ``close()``. ``stats`` returns a snapshot of the cumulative counters.
    """

    def __init__(
        self,
        num_workers: int = 2,
        timeout_s: float = 5.0,
        *,
        answer_format: str = "boxed_or_last",
        max_chars: int = DEFAULT_MAX_CHARS,
        memory_limit_mb: int = 1024,
        soft_fraction: float = 0.8,
        startup_timeout_s: float = 60.0,
        functions: Sequence[Mapping[str, str]] = (),
    ):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"MathRewardPool: num_workers must be an int >= 1, got {num_workers!r}")
        if not timeout_s > 0:
            raise ValueError(f"MathRewardPool: timeout_s must be > 0 seconds, got {timeout_s!r}")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(
                f"MathRewardPool: answer_format={answer_format!r} is not one of {ANSWER_FORMATS}"
            )
        if not isinstance(max_chars, int) or max_chars < 1:
            raise ValueError(f"MathRewardPool: max_chars must be an int >= 1, got {max_chars!r}")
        if not 0 < soft_fraction <= 1:
            raise ValueError(f"MathRewardPool: soft_fraction must be in (0, 1], got {soft_fraction!r}")
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.answer_format = answer_format
        self.max_chars = max_chars
        self.memory_limit_mb = int(memory_limit_mb)
        self.soft_fraction = float(soft_fraction)
        self.startup_timeout_s = float(startup_timeout_s)
        self.function_labels = tuple(f["label"] for f in functions)
        self.function_kinds: dict[str, str] = {}  # label -> "verl" or "trl", as the first ready worker found
        self._functions_json = json.dumps(
            [{key: str(f[key]) for key in ("label", "path", "name")} for f in functions]
        )

        self._lock = threading.Lock()
        self._pending: deque[_Item] = deque()
        self._stats = RewardStats()
        self._closed = False
        self._broken: BaseException | None = None
        self._startup_failures = 0
        self._next_id = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._workers = [_Worker(self.memory_limit_mb, self._functions_json) for _ in range(num_workers)]
        try:
            self._wait_ready()
        except BaseException:
            for w in self._workers:
                w.kill()
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        self._thread = threading.Thread(target=self._dispatch_loop, name="tepo-reward-dispatch", daemon=True)
        self._thread.start()
        _open_pools.add(self)

    # ------------------------------------------------------------------ public API
    def submit(
        self, responses: list[str], answers: list[str], *, answer_format: str | None = None
    ) -> RewardFuture:
        """Queue ``responses[i]`` against gold ``answers[i]``; returns at once with a ``RewardFuture``."""
        fmt = self.answer_format if answer_format is None else answer_format
        if fmt not in ANSWER_FORMATS:
            raise ValueError(f"MathRewardPool.submit: answer_format={fmt!r} is not one of {ANSWER_FORMATS}")
        responses, answers = list(responses), list(answers)
        if len(responses) != len(answers):
            raise ValueError(
                f"MathRewardPool.submit: got {len(responses)} responses but {len(answers)} answers; "
                "expected one gold answer per response"
            )
        for name, values in (("responses", responses), ("answers", answers)):
            for i, v in enumerate(values):
                if not isinstance(v, str):
                    raise TypeError(
                        f"MathRewardPool.submit: {name}[{i}] is {type(v).__name__}, expected str "
                        "(decode bytes first, e.g. with errors='replace')"
                    )
        payloads = [
            {
                "gold": sanitize(gold, self.max_chars),
                "response": sanitize(response, self.max_chars),
                "format": fmt,
                "max_chars": self.max_chars,
            }
            for response, gold in zip(responses, answers)
        ]
        return self._queue(payloads, "submit")

    def submit_calls(self, label: str, arguments: list[dict]) -> RewardFuture:
        """Queue one call of the user's reward function ``label`` per mapping of ``arguments`` (its keyword
        arguments, JSON values only; see ``user_functions.py``); returns at once with a ``RewardFuture``."""
        if label not in self.function_labels:
            known = ", ".join(self.function_labels) or "none"
            raise ValueError(f"MathRewardPool.submit_calls: no reward function {label!r} (loaded: {known})")
        payloads = [{"task": "call", "label": label, "arguments": a} for a in arguments]
        try:
            json.dumps(payloads)
        except (TypeError, ValueError) as err:
            raise TypeError(f"MathRewardPool.submit_calls: arguments must be JSON values ({err})") from None
        return self._queue(payloads, "submit_calls")

    def _queue(self, payloads: list[dict], caller: str) -> RewardFuture:
        future = RewardFuture(len(payloads))
        with self._lock:
            if self._closed:
                raise RuntimeError(f"MathRewardPool.{caller}: the pool is closed")
            if self._broken is not None:
                raise RuntimeError(f"MathRewardPool.{caller}: the pool is broken: {self._broken}")
            for i, payload in enumerate(payloads):
                self._pending.append(_Item(future, i, payload))
            self._wake()  # under the lock: close() cannot close the pipe in between
        return future

    def score(
        self, responses: list[str], answers: list[str], *, answer_format: str | None = None
    ) -> list[RewardResult]:
        """Blocking ``submit(...).result()``."""
        return self.submit(responses, answers, answer_format=answer_format).result()

    @property
    def stats(self) -> RewardStats:
        with self._lock:
            return RewardStats(**self._stats.as_dict())

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring)."""
        with self._lock:
            return [w.proc.pid for w in self._workers]

    def worker_startup_seconds(self) -> list[float | None]:
        """Seconds each current worker took from launch to ready (import and warm-up of math-verify)."""
        with self._lock:
            return [w.startup_s for w in self._workers]

    def close(self) -> None:
        """Stop the workers; results not yet delivered fail with RuntimeError. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join()
        for w in self._workers:
            w.kill()
        err = RuntimeError("MathRewardPool was closed before these rewards were scored")
        for item in self._pending:
            item.future._fail(err)
        for w in self._workers:
            if w.item is not None:
                w.item.future._fail(err)
        self._pending.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)
        _open_pools.discard(self)

    def __enter__(self) -> MathRewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wake(self) -> None:
        """Interrupt the dispatcher's select(); a full pipe already holds a pending wake-up."""
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"x")

    # ------------------------------------------------------------------ worker lifecycle
    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while not all(w.ready for w in self._workers):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"MathRewardPool: reward workers did not start within {self.startup_timeout_s} s"
                )
            fds = [w.fd for w in self._workers if not w.ready]
            readable, _, _ = select.select(fds, [], [], remaining)
            for w in self._workers:
                if w.fd in readable and not self._read(w):
                    raise RuntimeError(
                        "MathRewardPool: a reward worker exited during start-up "
                        f"(exit code {w.proc.poll()}): {w.stderr_tail()}"
                    )

    def _replace(self, w: _Worker) -> None:
        """Kill ``w`` (if alive) and start a new worker in its slot; called from the dispatcher only."""
        w.kill()
        with self._lock:
            self._stats.worker_restarts += 1
            self._workers[self._workers.index(w)] = _Worker(self.memory_limit_mb, self._functions_json)

    def _read(self, w: _Worker) -> bool:
        """Read what ``w`` wrote and handle complete lines; False on end of file (the worker died)."""
        try:
            data = os.read(w.fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            return False
        w.buffer += data
        while b"\n" in w.buffer:
            line, w.buffer = w.buffer.split(b"\n", 1)
            try:
                msg = json.loads(line)
                if not isinstance(msg, dict) or msg.get("status", "error") not in (*STATUSES, "scored"):
                    raise ValueError("unexpected message")
            except ValueError:
                return False  # a worker that breaks the protocol is treated as dead
            if msg.get("ready"):
                w.ready = True
                w.startup_s = time.monotonic() - w.started
                self.function_kinds = self.function_kinds or dict(msg.get("kinds", {}))
                self._startup_failures = 0
            elif w.item is not None and msg.get("id") == w.item_id:
                self._finish(w, msg["status"], msg.get("extracted"), msg.get("detail", ""), msg)
                with self._lock:
                    self._stats.parse_failures += bool(msg.get("parse_failure"))
        return True

    # ------------------------------------------------------------------ dispatching
    def _finish(
        self, w: _Worker, status: str, extracted: str | None, detail: str, msg: dict | None = None
    ) -> None:
        item = w.item
        seconds = time.monotonic() - w.item_start
        w.item, w.deadline = None, float("inf")
        if item.is_call:
            self._finish_call(item, status, seconds, detail, msg or {})
            return
        result = RewardResult(1.0 if status == "correct" else 0.0, status, extracted, seconds, detail)
        with self._lock:
            s = self._stats
            s.items += 1
            s.correct += status == "correct"
            s.wrong += status == "wrong"
            s.no_answer += status == "no_answer"
            s.timeouts += status == "timeout"
            s.errors += status == "error"
        item.future._set(item.index, result)

    def _finish_call(self, item: _Item, status: str, seconds: float, detail: str, msg: dict) -> None:
        """A user function's call: its value(s) when ``"scored"``, else 0 (the worker checked the values)."""
        status = status if status in CALL_STATUSES else "error"
        scored = status == "scored"
        values = tuple(float(v) for v in msg.get("values", ())) if scored else ()
        reward = float(msg.get("value", 0.0)) if scored else 0.0
        element_errors = tuple(int(i) for i in msg.get("element_errors", ())) if scored else ()
        with self._lock:
            self._stats.calls += 1
            self._stats.call_timeouts += status == "timeout"
            self._stats.call_errors += status == "error"
        item.future._set(
            item.index, RewardResult(reward, status, None, seconds, detail, values, element_errors)
        )

    def _hand_out(self) -> None:
        for w in list(self._workers):
            if not w.ready or w.item is not None:
                continue
            with self._lock:
                if not self._pending:
                    return
                item = self._pending.popleft()
            self._next_id += 1
            payload = {
                **item.payload,
                "id": self._next_id,
                "soft_deadline_s": self.soft_fraction * self.timeout_s,
            }
            w.item, w.item_id = item, self._next_id
            w.item_start = time.monotonic()
            w.deadline = w.item_start + self.timeout_s
            with contextlib.suppress(OSError):  # died while idle: the read side reports it
                w.send(json.dumps(payload).encode() + b"\n")

    def _dispatch_loop(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
            try:
                self._dispatch_once()
            except Exception as e:  # a bug here must not leave callers waiting forever
                with self._lock:
                    self._broken = e
                    pending = list(self._pending)
                    self._pending.clear()
                for item in pending:
                    item.future._fail(RuntimeError(f"MathRewardPool dispatcher failed: {e!r}"))
                for w in self._workers:
                    if w.item is not None:
                        w.item.future._fail(RuntimeError(f"MathRewardPool dispatcher failed: {e!r}"))
                return

    def _dispatch_once(self) -> None:
        self._hand_out()
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers]
        deadlines += [w.started + self.startup_timeout_s for w in self._workers if not w.ready]
        wait = max(0.0, min(deadlines) - now) if deadlines else None
        wait = None if wait == float("inf") else wait
        fds = [w.fd for w in self._workers]
        readable, _, _ = select.select([*fds, self._wake_r], [], [], wait)
        if self._wake_r in readable:
            os.read(self._wake_r, 1 << 12)
        for w in list(self._workers):
            if w.fd in readable and not self._read(w):
                self._on_worker_death(w)
        now = time.monotonic()
        for w in list(self._workers):
            if w.item is not None and now >= w.deadline:
                with self._lock:
                    self._stats.hard_timeouts += 1
                self._replace(w)  # counters first, so a caller woken by the result sees them
                self._finish(w, "timeout", None, f"worker killed at the hard deadline of {self.timeout_s} s")
            elif not w.ready and now >= w.started + self.startup_timeout_s:
                self._on_worker_death(w)

    def _on_worker_death(self, w: _Worker) -> None:
        code = w.proc.poll()
        if code is None:
            w.proc.kill()
            code = w.proc.wait()
        if w.item is not None and w.item.attempts == 0:
            # One retry on a fresh worker: the death may not be this item's doing (a worker killed from outside,
            # or one that died while idle just as it was handed this item). A second death scores "error".
            w.item.attempts += 1
            with self._lock:
                self._pending.appendleft(w.item)
            w.item, w.deadline = None, float("inf")
        elif w.item is not None:
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            detail = f"worker died ({how}) while verifying this item"
            last_line = w.stderr_tail(300).splitlines()[-1:]
            if last_line:
                detail += f"; last stderr line: {last_line[0][:200]!r}"
            self._replace(w)  # counters first, so a caller woken by the result sees them
            self._finish(w, "error", None, detail)
            return
        if not w.ready:
            self._startup_failures += 1
            if self._startup_failures >= 3:
                raise RuntimeError(f"reward workers keep failing to start; last stderr: {w.stderr_tail()}")
        self._replace(w)
