"""Evaluation: sample a model on problems, verify, and summarise (greedy accuracy, avg@k, pass@k).

- :mod:`tepo.evaluate.core`: ``score_problems`` (shared with the trainer's held-out evaluation), ``accuracy``;
- :mod:`tepo.evaluate.benchmarks`: benchmark names -> problems (``resolve_benchmark``);
- :mod:`tepo.evaluate.settings`: greedy/sampled settings and the ``tepo`` paper protocol;
- :mod:`tepo.evaluate.metrics`: metrics from ``samples.jsonl`` records;
- :mod:`tepo.evaluate.runner`: ``evaluate_benchmarks`` (resumable, writes ``samples.jsonl``/``results.json``);
- :mod:`tepo.evaluate.loading`: the model argument (hub name, path, embedded, run directory);
- :mod:`tepo.evaluate.cli`: ``tepo eval``.
"""

from tepo.evaluate.benchmarks import BENCHMARKS, resolve_benchmark
from tepo.evaluate.core import ProblemResult, accuracy, score_problems
from tepo.evaluate.metrics import benchmark_metrics
from tepo.evaluate.runner import BenchmarkTask, EvalReport, evaluate_benchmarks
from tepo.evaluate.settings import EvalError, EvalSetting

__all__ = [
    "BENCHMARKS",
    "BenchmarkTask",
    "EvalError",
    "EvalReport",
    "EvalSetting",
    "ProblemResult",
    "accuracy",
    "benchmark_metrics",
    "evaluate_benchmarks",
    "resolve_benchmark",
    "score_problems",
]
