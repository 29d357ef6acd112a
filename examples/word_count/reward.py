"""Rewards of the word-count example: a file of your own, as verl and TRL read one (no tepo import needed).

- ``compute_score``: verl's signature. 1 for a response of exactly the asked number of words, falling off
  linearly with the distance (0 at twice the distance of the target or more), so a group of samples with
  different lengths always has a signal.
- ``mentions_topic``: TRL's batched signature. 1 where the completion names the row's topic (the data row's
  ``topic`` column, which TRL-form functions get as a keyword list), else 0.
"""

import re

_WORD = re.compile(r"[A-Za-z0-9']+")


def count_words(text: str) -> int:
    return len(_WORD.findall(text))


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    target = int(ground_truth)
    return max(0.0, 1.0 - abs(count_words(solution_str) - target) / target)


def mentions_topic(prompts, completions, topic, **kwargs):
    return [float(t.lower() in c.lower()) for c, t in zip(completions, topic)]
