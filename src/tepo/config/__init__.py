"""Typed run configuration: dataclasses, YAML presets, ``key=value`` overrides, validation before any model loads.

A config is a tree of small dataclasses (``model``, ``data``, ``rollout``, ``algorithm``, ``optim``, ``train``,
``reward``, ``eval``, ``log``). Presets live in ``tepo/configs/*.yaml`` (found by name: ``--config tepo``) or
anywhere by path. Overrides use dotted keys (``algorithm.loss=grpo rollout.group_size=4``); values are parsed as
YAML scalars and then checked against the field's type. Every problem found is reported at once, one line each.

One job per module:

- :mod:`tepo.config.schema`: the dataclasses, their defaults and what each field does;
- :mod:`tepo.config.loading`: presets, overrides, renamed keys, coercion, ``config.yaml`` writing;
- :mod:`tepo.config.checks`: :func:`validate`, the cross-field rules and trial calls of the loss and estimator;
- :mod:`tepo.config.questions`: what a run asks of its config (loss options, reference model, start-up notes);
- :mod:`tepo.config.meanings`: every key's one-line meaning;
- :mod:`tepo.config.reference`: ``tepo config show``, a resolved config as YAML with each key's meaning and default.

Everything users imported from ``tepo.config`` before the split is importable from here as it was.
"""

from tepo.config.checks import MODEL_DTYPES, bf16_weights_on_cpu_message, validate
from tepo.config.loading import RENAMED_KEYS, list_presets, load_config, parse_overrides, save_config
from tepo.config.questions import config_warnings, loss_options
from tepo.config.schema import (
    DEFAULT_PRESET,
    AlgorithmConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    HfRolloutConfig,
    LogConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    ParityConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TrainConfig,
    VllmConfig,
)

__all__ = [
    "DEFAULT_PRESET",
    "MODEL_DTYPES",
    "RENAMED_KEYS",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "HfRolloutConfig",
    "LogConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "ParityConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "TrainConfig",
    "VllmConfig",
    "bf16_weights_on_cpu_message",
    "config_warnings",
    "list_presets",
    "load_config",
    "loss_options",
    "parse_overrides",
    "save_config",
    "validate",
]
