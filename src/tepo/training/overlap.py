"""Rollouts overlapped with the update (``rollout.async_steps=1``): one step off-policy.

While step k's update runs in the training thread, step k+1's batch is sampled (by an engine in a process of its
own) and scored (by the reward pool's worker processes) from a background thread. The engine then samples from
the weights as they were before step k's update: one policy version behind (``policy_lag`` 1). The trainer's
``pi_old`` is still its own pre-update forward pass, so the rollout correction (``algorithm.rollout_correction``)
covers the whole sampler/trainer gap, staleness included.

Order is what keeps a run reproducible: step k's prompts are taken from the stream before step k+1's, the
weights step k+1 samples from are copied in the training thread (``stage_weights``) before the update changes
them, and each batch's sampling seeds are those of its step, as in the synchronous loop.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from tepo.training.collect import Collected
from tepo.training.parts import StepParts
from tepo.training.step import collect_step

# Measured with the default run on a 2-core machine (docs/performance.md, "Overlapped rollouts"): 27.0 s per
# overlapped step against 20.6 s synchronous (3-seed means), because the synchronous loop gives each phase both
# cores while the overlap splits them and the two halves slow each other down (shared caches, memory bandwidth).
FEW_CORES = 2


def overlap_cores_note(cpu_cores: int, engine_on_gpu: bool) -> str | None:
    """A note for runs that overlap on so few CPU cores that the synchronous loop is faster, else None."""
    if engine_on_gpu or cpu_cores > FEW_CORES:
        return None
    return (
        f"rollout.async_steps=1 on {cpu_cores} CPU core(s): the engine and the update share or split them; on "
        "such a machine the synchronous loop (async_steps=0) was measured faster (docs/performance.md, "
        "'Overlapped rollouts'). The overlap pays where the engine has a device or cores of its own."
    )


def keep_off_engine_cores(rollout, log) -> tuple | None:
    """Before overlapping: log :func:`overlap_cores_note`'s note, if any, and where the engine has cores of its own
    (``rollout.trainer_cores``), keep this process's threads on the others (two OpenMP teams on the same cores
    slow both down). Returns what :func:`restore_cores` gives back, or None when nothing was changed."""
    note = overlap_cores_note(len(os.sched_getaffinity(0)), engine_on_gpu=torch.cuda.is_available())
    if note:
        log(f"note: {note}")
    cores = getattr(rollout, "trainer_cores", None)
    if not cores:
        return None
    before = (os.sched_getaffinity(0), torch.get_num_threads())
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(min(torch.get_num_threads(), len(cores)))
    return before


def restore_cores(before: tuple) -> None:
    """Give the process back the cores and threads :func:`keep_off_engine_cores` recorded."""
    cores, threads = before
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)


class RolloutPrefetch:
    """At most one batch in flight, sampled for a known step in a background thread from the run's ``parts``
    (their rollout backend and prompt stream)."""

    def __init__(self, parts: StepParts, pool):
        self.parts, self.pool = parts, pool
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tepo-rollout")
        self._future: Future | None = None
        self._step: int | None = None
        # The prompt stream's position before the in-flight batch took its prompts: what a checkpoint records, so
        # that a resumed run samples that batch again instead of skipping its prompts.
        self.stream_state: dict | None = None

    def start(self, step: int) -> float:
        """Sample and score step ``step``'s batch in the background; returns the seconds the weight copy took."""
        if self._future is not None:
            raise RuntimeError("a rollout is already in flight")
        self.stream_state = self.parts.stream.state_dict()
        copy_seconds = self.parts.rollout.stage_weights()
        self._step = step
        self._future = self._executor.submit(collect_step, self.parts, self.pool, step)
        return copy_seconds

    def take(self, step: int) -> Collected | None:
        """The batch sampled for ``step`` (waiting for it), or None when none is in flight for that step."""
        if self._future is None or self._step != step:
            return None
        start = time.perf_counter()
        future, self._future, self._step, self.stream_state = self._future, None, None, None
        try:
            collected = future.result()
        finally:
            self.parts.rollout.end_staging()
        collected.metrics["time/rollout_wait_seconds"] = time.perf_counter() - start
        collected.metrics["rollout/policy_lag"] = 1
        return collected

    def settle(self) -> None:
        """Wait until the in-flight batch (if any) is done, keeping it for ``take``: the engine is then idle (for
        an evaluation) and the stream no longer moves."""
        if self._future is not None:
            self._future.exception()  # waits; an error surfaces at take()
            self.parts.rollout.end_staging()

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
