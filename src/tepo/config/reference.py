"""``tepo config show``: a resolved configuration as YAML with every key's meaning and default above it.

The text is a complete run configuration: saved to a file and edited, ``tepo train --config FILE`` reads it back
to the same configuration (tested for ``default`` and several presets). The meanings come from
:data:`tepo.config.meanings.MEANINGS`, the defaults from the schema's dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import typing

import yaml

from tepo.config.meanings import MEANINGS
from tepo.config.schema import RunConfig


def config_keys(config_class: type = RunConfig, prefix: str = "") -> list[str]:
    """Every leaf key of the schema, dotted, in declaration order (``model.lora.rank``...)."""
    keys = []
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        if dataclasses.is_dataclass(hints[field.name]):
            keys += config_keys(hints[field.name], f"{prefix}{field.name}.")
        else:
            keys.append(prefix + field.name)
    return keys


def yaml_value(value) -> str:
    """One value as inline YAML that reads back to the same value (``null``, ``2.0e-05``, ``{eps: 0.2}``)."""
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    text = text.removesuffix("\n...\n").strip()
    if "\n" in text:  # a string with line breaks: JSON's double-quoted form is YAML too, and one line
        text = json.dumps(value, ensure_ascii=False)
    return text


def show_config(config: RunConfig, *, title: str) -> str:
    """``config`` as commented YAML: a header naming ``title`` (what it was resolved from), then each section
    with every key, its meaning and its default on the line above it."""
    defaults = _flat(RunConfig().to_dict())
    values = _flat(config.to_dict())
    lines = [
        f"# tepo configuration: {title}",
        "# Every key with its meaning and default. Save this, edit it, and train with",
        "#   .venv/bin/tepo train --config FILE.yaml [key=value ...]",
    ]
    written: set[str] = set()
    for key in config_keys():
        *parents, leaf = key.split(".")
        for depth in range(len(parents)):
            section = ".".join(parents[: depth + 1])
            if section not in written:
                written.add(section)
                lines += [""] if depth == 0 else []
                lines.append(f"{'  ' * depth}{parents[depth]}:")
        indent = "  " * len(parents)
        lines.append(f"{indent}# {MEANINGS[key]} [default: {yaml_value(defaults[key])}]")
        lines += [f"{indent}#   {line}" for line in _more_about(key, config)]
        lines.append(f"{indent}{leaf}: {yaml_value(values[key])}")
    return "\n".join(lines) + "\n"


REWARD_FUNCTION_FIELDS = (
    "each entry: {name: correctness or format, weight: W} for a built-in, or {path: FILE.py or package.module, "
    "name: FUNCTION, weight: W, label: LABEL} for your own",
    "path: read from this file's folder (else the working directory); name: the function in it (verl's "
    "compute_score(data_source, solution_str, ground_truth, extra_info) or TRL's reward_func(prompts, "
    "completions, **kwargs))",
    "weight: its share of the summed reward (default 1); label: its column and metrics' name "
    "(reward/<label>_mean; default: name)",
)


def _more_about(key: str, config: RunConfig) -> list[str]:
    """Lines under a key's meaning where one line cannot say it: the fields of a reward.functions entry, and
    the options the resolved loss takes."""
    if key == "reward.functions":
        return list(REWARD_FUNCTION_FIELDS)
    if key == "algorithm.loss_options":
        from tepo.losses import POLICY_LOSSES

        spec = POLICY_LOSSES.get(config.algorithm.loss)
        if spec is None:
            return []
        options = ", ".join(
            [f"{name}: {yaml_value(value)}" for name, value in spec.defaults.items()]
            + [f"agg: {spec.default_agg}"]
        )
        return [f"{spec.name}'s options and defaults: {{{options}}} (tepo losses lists every loss's)"]
    return []


def _flat(tree: dict) -> dict:
    """``{"model": {"lora": {"rank": 0}}}`` -> ``{"model.lora.rank": 0}``, leaves at the schema's keys."""
    keys = config_keys()
    out = {}
    for key in keys:
        node = tree
        for part in key.split("."):
            node = node[part]
        out[key] = node
    return out
