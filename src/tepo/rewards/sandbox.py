"""``SandboxedPool``: worker processes that each run one item at a time under a hard per-item deadline.

Model output is untrusted. Each item runs in a worker process (``_worker.py``). One dispatcher thread in the
parent hands items to idle workers, one at a time per worker, and enforces a hard deadline of ``timeout_s`` per
item (from hand-off to that worker, not from queueing): a worker that overruns is killed (SIGKILL) and replaced,
and the item ends with status ``"timeout"``. Inside the worker a softer SIGALRM deadline at
``soft_fraction * timeout_s`` interrupts the work first, so most hostile items end without a respawn.

Failures: a MemoryError under the worker's ``RLIMIT_AS`` cap is reported by the worker as ``"error"``, after
which it exits and is replaced. A worker that dies outright (segfault, killed) gets its item retried once on a
fresh worker, since a death is not always the item's doing (e.g. a worker that died while idle just as it was
handed an item); a second death ends the item with ``"error"``. Such an item may take two timeouts plus a
start-up.

Start method: workers are fresh interpreters started with ``subprocess`` (fork+exec, like multiprocessing's
"spawn"), not ``multiprocessing``: nothing is forked from a parent that holds torch threads, the parent's
``__main__`` is not re-imported (scripts need no ``if __name__ == "__main__"`` guard), and only JSON lines cross
the pipes (nothing is pickled).

Logs: a worker's stdout and stderr (what a library or a user's reward function prints) go to
``log_dir/reward_worker_<slot>.log`` when the pool has a ``log_dir`` (a run directory), appended across the
slot's respawns; else to a temporary file, read only for the last lines of a worker that died.

What an item is and what its result becomes is the subclass's (``_deliver``): ``pool.RewardPool`` runs
math-verify verifications (``math_items.py``) and calls of the user's functions (``call_items.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from .results import RewardFuture, RewardStats

_WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
RESULT_STATUSES = ("correct", "wrong", "no_answer", "timeout", "error", "scored")


@dataclass
class _Item:
    future: RewardFuture
    index: int
    payload: dict  # the request's JSON fields but its id and deadline (strings already sanitized)
    attempts: int = 0


class _Worker:
    """One worker process and the parent's view of it."""

    def __init__(self, memory_limit_mb: int, functions_json: str, log_path: Path | None):
        if log_path is None:
            self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker
        else:
            self.log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the worker
        self.log_start = self.log.seek(0, os.SEEK_END)
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
        """The last ``n`` bytes this worker wrote to its log."""
        try:
            self.log.flush()
            size = os.fstat(self.log.fileno()).st_size
            with open(self.log.fileno(), "rb", closefd=False) as f:
                f.seek(max(self.log_start, size - n))
                return f.read().decode("utf-8", "replace").strip()
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


class SandboxedPool:
    """Workers, their queue and the dispatcher thread; see the module doc. Subclasses define ``_deliver``."""

    name = "SandboxedPool"

    def _start(
        self,
        num_workers: int,
        timeout_s: float,
        *,
        memory_limit_mb: int,
        soft_fraction: float,
        startup_timeout_s: float,
        functions_json: str,
        log_dir: Path | None,
    ) -> None:
        """Start ``num_workers`` workers, wait until each is ready, then the dispatcher."""
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.memory_limit_mb = int(memory_limit_mb)
        self.soft_fraction = float(soft_fraction)
        self.startup_timeout_s = float(startup_timeout_s)
        self.function_kinds: dict[str, str] = {}  # label -> "verl" or "trl", as the first ready worker found
        self._functions_json = functions_json
        self.log_dir = None if log_dir is None else Path(log_dir)
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pending: deque[_Item] = deque()
        self._stats = RewardStats()
        self._closed = False
        self._broken: BaseException | None = None
        self._startup_failures = 0
        self._next_id = 0
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._workers = [self._new_worker(slot) for slot in range(num_workers)]
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

    def log_path(self, slot: int) -> Path | None:
        """Where worker ``slot``'s stdout and stderr go (None: a temporary file)."""
        return None if self.log_dir is None else self.log_dir / f"reward_worker_{slot}.log"

    def _new_worker(self, slot: int) -> _Worker:
        return _Worker(self.memory_limit_mb, self._functions_json, self.log_path(slot))

    def _deliver(self, item: _Item, status: str, extracted, seconds: float, detail: str, msg: dict):
        """The item's ``RewardResult``, its counters updated (called under the lock)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ public API
    def _queue(self, payloads: list[dict], caller: str) -> RewardFuture:
        future = RewardFuture(len(payloads))
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name}.{caller}: the pool is closed")
            if self._broken is not None:
                raise RuntimeError(f"{self.name}.{caller}: the pool is broken: {self._broken}")
            for i, payload in enumerate(payloads):
                self._pending.append(_Item(future, i, payload))
            self._wake()  # under the lock: close() cannot close the pipe in between
        return future

    @property
    def stats(self) -> RewardStats:
        with self._lock:
            return RewardStats(**self._stats.as_dict())

    def worker_pids(self) -> list[int]:
        """Process ids of the current workers (for monitoring)."""
        with self._lock:
            return [w.proc.pid for w in self._workers]

    def worker_startup_seconds(self) -> list[float | None]:
        """Seconds each current worker took from launch to ready (its imports and warm-up)."""
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
        err = RuntimeError(f"{self.name} was closed before these rewards were scored")
        for item in self._pending:
            item.future._fail(err)
        for w in self._workers:
            if w.item is not None:
                w.item.future._fail(err)
        self._pending.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)
        _open_pools.discard(self)

    def __enter__(self):
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
                    f"{self.name}: reward workers did not start within {self.startup_timeout_s} s"
                )
            fds = [w.fd for w in self._workers if not w.ready]
            readable, _, _ = select.select(fds, [], [], remaining)
            for w in self._workers:
                if w.fd in readable and not self._read(w):
                    raise RuntimeError(
                        f"{self.name}: a reward worker exited during start-up "
                        f"(exit code {w.proc.poll()}): {w.stderr_tail()}"
                    )

    def _replace(self, w: _Worker) -> None:
        """Kill ``w`` (if alive) and start a new worker in its slot; called from the dispatcher only."""
        w.kill()
        with self._lock:
            self._stats.worker_restarts += 1
            slot = self._workers.index(w)
            self._workers[slot] = self._new_worker(slot)

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
                if not isinstance(msg, dict) or msg.get("status", "error") not in RESULT_STATUSES:
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
        return True

    # ------------------------------------------------------------------ dispatching
    def _finish(
        self, w: _Worker, status: str, extracted: str | None, detail: str, msg: dict | None = None
    ) -> None:
        item = w.item
        seconds = time.monotonic() - w.item_start
        w.item, w.deadline = None, float("inf")
        with self._lock:
            result = self._deliver(item, status, extracted, seconds, detail, msg or {})
        item.future._set(item.index, result)

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
                error = RuntimeError(f"{self.name} dispatcher failed: {e!r}")
                for item in pending:
                    item.future._fail(error)
                for w in self._workers:
                    if w.item is not None:
                        w.item.future._fail(error)
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
            detail = f"worker died ({how}) while running this item"
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
