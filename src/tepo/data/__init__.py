"""Problems with verifiable answers: loading from files or the Hugging Face hub, procedural tasks, prompts.

- :mod:`tepo.data.problems`: :class:`Problem` (id, text, gold answer) and :class:`DataError`,
- :mod:`tepo.data.tasks`: the procedural tasks (``arithmetic``, ``arithmetic-multistep``, ``arithmetic-mix``),
- :mod:`tepo.data.loading`: :func:`load_problems` from a task name, a JSONL/Parquet path or a hub dataset name,
- :mod:`tepo.data.prompts`: chat-formatted prompt ids and the seeded, resumable :class:`PromptStream`.
"""

from __future__ import annotations

from tepo.data.loading import load_problems
from tepo.data.problems import DataError, Problem
from tepo.data.prompts import DEFAULT_INSTRUCTION, PromptStream, build_prompt_ids
from tepo.data.tasks import (
    MIXTURE_TASK,
    PROCEDURAL_TASKS,
    make_arithmetic_problems,
    make_mixture_problems,
    make_task_problems,
)

__all__ = [
    "DEFAULT_INSTRUCTION",
    "MIXTURE_TASK",
    "PROCEDURAL_TASKS",
    "DataError",
    "Problem",
    "PromptStream",
    "build_prompt_ids",
    "load_problems",
    "make_arithmetic_problems",
    "make_mixture_problems",
    "make_task_problems",
]
