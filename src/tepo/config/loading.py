"""Reading a run configuration: presets (``tepo/configs/*.yaml``, found by name) or YAML files by path, with
``base:`` inheritance, dotted ``key=value`` overrides parsed as YAML scalars, renamed keys mapped with one note,
values coerced to the field types (every problem reported at once, one line each), then :func:`tepo.config.checks.validate`;
and writing ``config.yaml`` atomically.

Paths in a YAML file (``base:``, ``data.source``, ``eval.source``, the ``path`` of ``reward.functions``) are read
from that file's folder, so a config works from any working directory; a relative path found there is made
absolute (a run's saved ``config.yaml`` then works from anywhere too). One that is not there is read from the
working directory (verl reads its reward path so, and configs written for it keep working). A name that is not a
path (a preset, a Hugging Face dataset, a benchmark, a module) is left as it is. Overrides on the command line
are read from the working directory."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from tepo.config.checks import validate
from tepo.config.schema import DEFAULT_PRESET, ROLLOUT_FLAT_KEYS, ConfigError, RunConfig


def list_presets() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("tepo.configs").iterdir() if p.name.endswith(".yaml"))


def _read_yaml(source: str) -> tuple[dict, str]:
    """A YAML file by path, or a preset by name (``tepo``, ``grpo``...); and where it came from (the path, or
    ``preset NAME``)."""
    path = Path(source)
    if path.is_file():
        where = str(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{where}: not valid UTF-8 (byte {err.start}); expected a UTF-8 YAML file"
            ) from None
        except OSError as err:
            raise ConfigError(f"{where}: cannot be read ({err.strerror})") from None
    else:
        preset = resources.files("tepo.configs") / f"{path.stem}.yaml"
        if "/" in source or not preset.is_file():
            raise ConfigError(
                f"config {source!r}: no such file or preset (presets: {', '.join(list_presets())})"
            )
        text, where = preset.read_text(encoding="utf-8"), f"preset {path.stem}"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: invalid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of sections at top level")
    return data, where


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("loss_options",):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_with_bases(source: str, notes: list[str], errors: list[str], seen: tuple = ()) -> tuple[dict, str]:
    """A preset may name another with ``base: NAME``; the base is loaded first and this file merged over it.
    Renamed keys are read in each file before the merge (:func:`_renamed`), so a file's new name beats its base's
    old one."""
    data, where = _read_yaml(source)
    base = data.pop("base", None)
    data = _renamed(data, notes, errors, where)
    folder = None if where.startswith("preset ") else Path(source).parent
    if folder is not None:
        data = resolve_paths(data, folder)
    if base is None:
        return data, where
    base = str(base)
    if folder is not None and (folder / base).expanduser().is_file():
        base = str((folder / base).expanduser().resolve())
    if base in seen:
        raise ConfigError(f"{where}: circular base {base!r}")
    try:
        base_data, _ = _load_with_bases(base, notes, errors, (*seen, base))
    except ConfigError as err:
        if str(err).startswith(f"config {base!r}"):  # the base itself was not found: say who asked for it
            looked = (
                f" (looked in {folder.resolve()} and the working directory)" if folder is not None else ""
            )
            raise ConfigError(f"{where}: base {base!r}{looked}: {str(err).split(': ', 1)[1]}") from None
        raise
    return _deep_merge(base_data, data), where


_DATA_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


def resolve_paths(data: dict, folder: Path) -> dict:
    """``data`` (one YAML file's sections) with its relative paths read from ``folder``, the file's (see the
    module doc): made absolute where the path exists there, else left for the working directory."""
    out = _copy_sections(data)

    def from_folder(value, *, is_path) -> object:
        if (
            not isinstance(value, str)
            or not value
            or Path(value).expanduser().is_absolute()
            or not is_path(value)
        ):
            return value
        candidate = folder / value
        return str(candidate.resolve()) if candidate.exists() else value

    def data_file(value: str) -> bool:
        return value.endswith(_DATA_FILE_SUFFIXES) or (folder / value).is_file()

    for section in ("data", "eval"):
        if isinstance(out.get(section), dict) and "source" in out[section]:
            out[section]["source"] = from_folder(out[section]["source"], is_path=data_file)
    functions = out.get("reward", {}).get("functions") if isinstance(out.get("reward"), dict) else None
    if isinstance(functions, list):
        from tepo.rewards.user_functions import is_file_path

        out["reward"]["functions"] = [
            {**entry, "path": from_folder(entry["path"], is_path=is_file_path)}
            if isinstance(entry, dict) and "path" in entry
            else entry
            for entry in functions
        ]
    return out


def parse_overrides(overrides: list[str]) -> dict:
    """``["a.b=1", "c.d=[x, y]"]`` -> nested dict with YAML-parsed values."""
    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. algorithm.loss=grpo")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.strip().split(".")
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[: depth + 1])!r} was already given the value {node!r} "
                    "by an earlier override; it is a section, set its keys instead"
                )
        node[parts[-1]] = value
    return tree


def load_config(source: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Build and validate a config from a preset/file (default: built-in defaults) plus dotted overrides."""
    notes: list[str] = []
    errors: list[str] = []
    # Renamed keys are read per layer (each file, the overrides), so an override of either name beats the file's
    # value of either name.
    data, where = _load_with_bases(source or DEFAULT_PRESET, notes, errors)
    data = _deep_merge(data, _renamed(parse_overrides(overrides or []), notes, errors, "the overrides"))
    config = _build(RunConfig, data, "", errors, where)
    errors.extend(validate(config))  # fields that failed to parse kept their defaults: no spurious messages
    if errors:
        raise ConfigError("invalid configuration:\n" + "\n".join(f"  - {e}" for e in errors))
    config.renamed_key_notes = notes  # not a field: reported by config_warnings, never saved
    return config


# Deprecated key -> its new name, both dotted. The old name is still read so that presets, command lines and the
# config.yaml of existing run directories keep working: one note per file or command line that uses old names
# (naming each old key and its new one), and an error where one of them gives an old key and its new one with
# different values.
RENAMED_KEYS = {
    "train.keep_checkpoints": "train.keep_last",
    **{f"rollout.{old}": "rollout." + ".".join(new) for old, new in ROLLOUT_FLAT_KEYS.items()},
}

_MISSING = object()


def _renamed(data: dict, notes: list[str], errors: list[str], where: str) -> dict:
    """``data`` (one layer: a file or the overrides) with each deprecated key moved to its new place."""
    out = _copy_sections(data)
    moved = []
    for old, new in RENAMED_KEYS.items():
        *old_parents, old_key = old.split(".")
        parent = _node(out, old_parents)
        if parent is None or old_key not in parent:
            continue
        *new_parents, new_key = new.split(".")
        target = _node(out, new_parents, create=True)
        if target is None:  # the new key's section is given as something other than a mapping: _build says so
            continue
        value = parent.pop(old_key)
        given = target.get(new_key, _MISSING)
        if given is not _MISSING and given != value:
            errors.append(
                f"{old} and {new} in {where} differ ({value!r} and {given!r}): {old} is the deprecated name of "
                f"{new}; give only {new}"
            )
            continue
        target[new_key] = value
        moved.append((old, new, value))
    if len(moved) == 1:
        old, new, value = moved[0]
        notes.append(f"{old} in {where} is deprecated: rename it {new} (read as {new}={value!r} there)")
    elif moved:
        pairs = ", ".join(f"{old} -> {new}" for old, new, _ in moved)
        notes.append(f"deprecated key names in {where}, read under their new names: {pairs}")
    return out


def _copy_sections(data: dict) -> dict:
    """A copy of ``data`` whose nested mappings may be changed without touching the caller's."""
    return {k: _copy_sections(v) if isinstance(v, dict) else v for k, v in data.items()}


def _node(data: dict, path: list[str], *, create: bool = False) -> dict | None:
    """The mapping at ``path`` in ``data`` (made where missing if ``create``); None where something else is."""
    node = data
    for part in path:
        child = node.get(part)
        if child is None and create and part not in node:
            child = node[part] = {}
        if not isinstance(child, dict):
            return None
        node = child
    return node


def _build(cls, data: Any, prefix: str, errors: list[str], where: str):
    if not isinstance(data, dict):
        errors.append(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
        return cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            errors.append(
                f"unknown key {prefix + str(key)!r} in {where} (valid here: {', '.join(sorted(fields))})"
            )
            continue
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, f"{prefix}{key}.", errors, where)
            continue
        ok, converted = _coerce(value, hint)
        if not ok:
            errors.append(f"{prefix}{key}: expected {_type_name(hint)}, got {value!r}")
            continue
        kwargs[key] = converted
    return cls(**kwargs)


def _type_name(hint) -> str:
    if hint is float:
        return "a finite float"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(value: Any, hint) -> tuple[bool, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            ok, converted = _coerce(value, option)
            if ok:
                return True, converted
        return False, None
    if hint is type(None):
        return (value is None), None
    if hint is Any:
        return True, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            # YAML 1.1 reads "1e-4" (no dot) as a string; accept any plain decimal/scientific number.
            try:
                number = float(value)
            except ValueError:
                return False, None
        else:
            return False, None
        # No setting means anything at nan or inf (.nan, .inf, "inf"): refuse them here, by name.
        return (True, number) if math.isfinite(number) else (False, None)
    if hint is str:
        return isinstance(value, str), value
    if origin is dict:
        return isinstance(value, dict), value
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list | tuple) or len(value) != len(args):
            return False, None
        converted = []
        for item, arg in zip(value, args):
            ok, c = _coerce(item, arg)
            if not ok:
                return False, None
            converted.append(c)
        return True, tuple(converted)
    return isinstance(value, hint), value


def save_config(config: RunConfig, path: Path, *, header: str | None = None) -> None:
    """Write ``config.yaml`` atomically: a run killed mid-write keeps the old file (or none), never half of one,
    so ``tepo train --resume`` can always read it. ``header``: a comment written above the keys (the run's
    resolved precision and why)."""
    from tepo.files import atomic_write_text

    data = config.to_dict()
    data["optim"]["betas"] = list(data["optim"]["betas"])
    comment = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    atomic_write_text(Path(path), comment + yaml.safe_dump(data, sort_keys=False))
