"""The training and held-out problems of a run, loaded and validated before any model is."""

from __future__ import annotations

from tepo.config import ConfigError, RunConfig
from tepo.data import PROCEDURAL_TASKS, Problem, load_problems
from tepo.evaluate.benchmarks import benchmark_names, resolve_benchmark


def held_out_seed(config: RunConfig) -> int:
    """The seed of a procedural task's held-out draw: ``eval.seed``, else ``train.seed``."""
    return config.train.seed if config.eval.seed is None else config.eval.seed


def load_datasets(config: RunConfig) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)``: the held-out set is ``eval.source`` (a benchmark name or a file), else the test split
    of a procedural task, else the last ``eval.size`` training problems."""
    d = config.data
    train = load_problems(
        d.source,
        problem_field=d.problem_field,
        answer_field=d.answer_field,
        split=d.split,
        limit=d.limit,
        seed=config.train.seed,
        subset=d.subset,
    )
    if config.eval.size == 0:
        return train, []
    if config.eval.source in benchmark_names():
        held_out = resolve_benchmark(config.eval.source)[: config.eval.size]  # math500, gsm8k, aime24, ...
    elif config.eval.source:
        held_out = load_problems(
            config.eval.source,
            problem_field=d.problem_field,
            answer_field=d.answer_field,
            split="test",
            limit=config.eval.size,
        )
    elif d.source in PROCEDURAL_TASKS:
        held_out = load_problems(d.source, split="test", limit=config.eval.size, seed=held_out_seed(config))
        # The training stream already avoids its own seed's test stream; a held-out set of another seed, or one
        # larger than that stream's excluded prefix, is kept out here, so no held-out problem is trained on.
        held_texts = {p.problem for p in held_out}
        train = [p for p in train if p.problem not in held_texts]
    else:
        if len(train) <= config.eval.size:
            raise ConfigError(
                f"data.source has {len(train)} problems, too few to hold out eval.size={config.eval.size} "
                "(the last rows of the file when eval.source is null); set eval.size=0 (no held-out "
                "evaluation, the own_task preset's), a smaller eval.size, or eval.source"
            )
        train, held_out = train[: -config.eval.size], train[-config.eval.size :]
    return train, held_out


def held_out_note(config: RunConfig, num_train: int) -> str | None:
    """The start-up line that says which rows of the training file are held out (None when none are)."""
    source, size = config.eval.source, config.eval.size
    if size == 0 or source or config.data.source in PROCEDURAL_TASKS:
        return None
    return (
        f"the last {size} of {num_train + size} problems of {config.data.source} are held out of training and "
        "graded by math-verify (eval.size; eval.size=0 trains on every row, eval.source names another set)"
    )
