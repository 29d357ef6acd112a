"""Prompts for the rollout and the training stream of problems."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from tepo.data.problems import DataError, Problem

DEFAULT_INSTRUCTION = "Answer with the final number in \\boxed{}."


def build_prompt_ids(
    tokenizer, problems: Sequence[Problem], instruction: str = DEFAULT_INSTRUCTION
) -> list[list[int]]:
    """Chat-format each problem (user turn: problem + instruction) and tokenize, ready for the rollout."""
    out = []
    for problem in problems:
        content = f"{problem.problem} {instruction}".strip()
        messages = [{"role": "user", "content": content}]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        else:
            text = content + "\n"
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


class PromptStream:
    """An endless, seeded, epoch-shuffled stream of problems whose position can be saved and restored.

    The position (``epoch``, ``offset``) goes into checkpoints so a resumed run sees exactly the prompts an
    uninterrupted one would, including the extra prompts dynamic sampling draws.
    """

    def __init__(self, problems: Sequence[Problem], seed: int):
        if not problems:
            raise DataError("the training set is empty")
        self.problems = list(problems)
        self.seed = seed
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, count: int) -> list[Problem]:
        batch = []
        for _ in range(count):
            if self.offset >= len(self._order):
                self.epoch += 1
                self.offset = 0
                self._order = self._permutation(self.epoch)
            batch.append(self.problems[self._order[self.offset]])
            self.offset += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation(self.epoch)

    def __iter__(self) -> Iterator[Problem]:
        while True:
            yield from self.take(1)
