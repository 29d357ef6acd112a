"""Helpers shared by the step benchmarks: subprocess runs that print one JSON line, memory, load, statistics.

Every measured configuration runs in its own fresh Python process so that peak resident memory (``ru_maxrss``)
belongs to that configuration alone, and the parent alternates configurations (A, B, A, B, ...) so that a change
in machine load (other jobs on the shared cores) hits both sides alike. Ratios are therefore more trustworthy than
the absolute seconds, which move with the load average printed next to them.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

RESULT_PREFIX = "BENCH_RESULT "


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _tree_pids(root: int | None = None):
    """A process and all its living descendants, each pid once."""
    stack, seen = [root or os.getpid()], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        yield pid
        stack += _children(pid)


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system) used so far by a process and its living descendants, from /proc/<pid>/stat.

    A step's CPU cost is the difference of two readings: it counts the vLLM server and the reward workers, which
    ``time.process_time()`` (this process only) leaves out. Children that exited are not counted."""
    total = 0
    for pid in _tree_pids(root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def tree_pss_mb(root: int | None = None) -> float:
    """Proportional set size of a process and all its descendants, MiB.

    PSS splits shared pages between the processes that map them, so the sum over a tree is the memory the tree
    really holds (a sum of RSS would count torch's shared libraries once per process). Used for backends that run
    part of the work in other processes (the vLLM server and its engine workers, the reward workers).
    """
    total_kb = 0
    for pid in _tree_pids(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total_kb += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kb / 1024


class TreeMemorySampler:
    """Samples :func:`tree_pss_mb` of this process's tree every ``interval`` s in a thread; ``peak_mb`` is the max
    (nan with ``interval`` 0: not sampled)."""

    def __init__(self, interval: float = 0.25):
        import threading

        self.interval = interval
        self.peak_mb = 0.0 if interval > 0 else float("nan")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, tree_pss_mb())
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.interval > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def set_threads(threads: int | None) -> None:
    """Fix torch's intra-op threads (and OpenMP's) before any work: on shared cores, spinning OpenMP threads that
    wait for a busy core make 2 threads several times slower than 1 (measured here)."""
    import torch

    if threads:
        torch.set_num_threads(threads)


def bind_engine_cores(threads: int) -> None:
    """Bind the vLLM engine's OpenMP threads to this process's first ``threads`` cores, the trainer's thread count:
    in the synchronous loop the two never compute at the same time. A value the user set wins."""
    import os

    cores = sorted(os.sched_getaffinity(0))[:threads]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))


def source_commit() -> str | None:
    """The repository's commit these benchmarks ran from, with ``+dirty`` when tracked files differ from it (None
    outside a git checkout): written into result files so that a number can be traced to its code."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        changes = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit.stdout.strip() + ("+dirty" if changes.stdout.strip() else "")


def emit(result: dict) -> None:
    """Print the worker's result as one prefixed JSON line (the parent ignores everything else on stdout)."""
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def run_worker(argv: list[str], *, env: dict | None = None, timeout: float = 3600) -> dict:
    """Run ``python argv...`` in a fresh process; return its result dict (or an ``error`` entry on failure)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    wall = time.perf_counter() - start
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX) :])
            result["process_wall_seconds"] = wall
            return result
    tail = (proc.stderr or proc.stdout)[-3000:]
    return {"error": f"worker {' '.join(argv)} exited {proc.returncode} without a result:\n{tail}"}


def median(values) -> float:
    values = [v for v in values if v is not None and v == v]
    return statistics.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def fmt(x: float, digits: int = 2) -> str:
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def machine_precision(device: str = "cpu") -> dict:
    """The CPU (model, the flags that matter), the GPU if any, and the precision ``auto`` resolves to on ``device``
    (tepo.precision): every side of a benchmark runs at this precision, and its JSON and table record it."""
    from tepo.precision import cpu_info, resolve_precision

    cpu = cpu_info()
    precision, _ = resolve_precision("auto", "auto", "auto", device)
    gpu = None
    if device.startswith("cuda"):
        import torch

        gpu = torch.cuda.get_device_name(torch.device(device).index)
    return {
        "cpu_model": cpu.model,
        "cpu_flags": cpu.reported_flags(),
        "gpu": gpu,
        "bf16": precision.model_autocast_bf16,  # the update's autocast on both sides (TRL: bf16=)
        "precision": precision.label,
        "reason": precision.reason,
    }


def precision_line(machine: dict) -> str:
    """One line for a benchmark's printed output: the machine and the precision both sides ran at."""
    where = machine["gpu"] or f"{machine['cpu_model']} ({' '.join(machine['cpu_flags'])})"
    return f"machine: {where}; precision for both sides: {machine['precision']} ({machine['reason']})"
