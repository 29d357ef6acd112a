"""The model to evaluate: a Hugging Face name, a local model directory, the embedded default, or a training run.

A run directory (``tepo train`` output: ``config.yaml`` + ``checkpoints/step_*/``) is evaluated at its newest intact
checkpoint: the base model named by ``model.name`` in its ``config.yaml`` (null: the embedded model) is loaded and
the checkpoint's safetensors weights replace its own (the tied ``lm_head`` is restored by ``tie_weights``). A single
checkpoint directory (``RUN/checkpoints/step_000012``) is evaluated as it is. A LoRA run (``model.lora.rank > 0``)
saved only its adapters: they are put on the base model with the run's ``model.lora`` and merged into its weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tepo.checkpoint import (
    Checkpoint,
    CheckpointError,
    find_latest_checkpoint,
    load_checkpoint,
    verify_checkpoint,
)
from tepo.evaluate.settings import EvalError

EMBEDDED_LABEL = "embedded"


def _run_dir_of_checkpoint(path: Path) -> Path | None:
    if (path / "model.safetensors").is_file() and path.parent.name == "checkpoints":
        run_dir = path.parent.parent
        if (run_dir / "config.yaml").is_file():
            return run_dir
    return None


def describe_model(spec: str | os.PathLike | None) -> dict:
    """What ``spec`` refers to, without loading anything: ``kind`` ("embedded", "hub", "path", "run",
    "checkpoint") and, for runs, the base model, checkpoint path and step."""
    from tepo.models import EMBEDDED_ALIASES

    if spec is None or str(spec).lower() in EMBEDDED_ALIASES:
        return {"spec": EMBEDDED_LABEL, "kind": "embedded", "base_model": None}
    path = Path(spec).expanduser()
    if path.is_dir():
        checkpoint_run = _run_dir_of_checkpoint(path)
        if checkpoint_run is not None:
            problem = verify_checkpoint(path)
            if problem:
                raise EvalError(f"checkpoint {str(path)!r} cannot be used: {problem}")
            return {
                "spec": str(path.resolve()),
                "kind": "checkpoint",
                "run_dir": str(checkpoint_run.resolve()),
                "base_model": _base_model(checkpoint_run),
                "checkpoint": str(path.resolve()),
                "step": int(path.name.split("_")[-1]) if path.name.split("_")[-1].isdigit() else None,
            }
        if (path / "config.yaml").is_file() and not (path / "config.json").is_file():
            notes: list[str] = []
            latest = find_latest_checkpoint(path, warn=notes.append)
            if latest is None:
                extra = f" ({'; '.join(notes)})" if notes else ""
                raise EvalError(
                    f"run directory {str(path)!r} has no intact checkpoint under checkpoints/{extra}; "
                    "train with train.save_every > 0 or evaluate the base model instead"
                )
            return {
                "spec": str(path.resolve()),
                "kind": "run",
                "run_dir": str(path.resolve()),
                "base_model": _base_model(path),
                "checkpoint": str(latest.path.resolve()),
                "step": latest.step,
                "skipped_checkpoints": notes,
            }
        return {"spec": str(path.resolve()), "kind": "path", "base_model": str(path.resolve())}
    return {"spec": str(spec), "kind": "hub", "base_model": str(spec)}


def _base_model(run_dir: Path) -> str | None:
    config_path = run_dir / "config.yaml"
    try:
        config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise EvalError(f"{config_path}: not a readable YAML run configuration ({err})") from None
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict) or "name" not in model:
        raise EvalError(
            f"{config_path}: no model.name entry; expected the config.yaml that `tepo train` writes"
        )
    name = model["name"]
    if name is not None and not isinstance(name, str):
        raise EvalError(f"{config_path}: model.name must be a model name, path or null, got {name!r}")
    return name


def load_eval_model(
    spec: str | os.PathLike | None,
    *,
    device: str = "cpu",
    dtype=None,
    trust_remote_code: bool = False,
):
    """``(model, tokenizer, info)`` for ``spec`` (see the module docstring); ``info`` is :func:`describe_model`."""
    import torch

    from tepo.models import load_model_and_tokenizer

    info = describe_model(spec)
    dtype = dtype or torch.float32
    try:
        model, tokenizer = load_model_and_tokenizer(
            info["base_model"], dtype=dtype, trust_remote_code=trust_remote_code, device=device
        )
    except (OSError, ValueError) as err:
        raise EvalError(f"could not load model {info['spec']!r}: {err}") from None
    if info["kind"] in ("run", "checkpoint"):
        checkpoint = Checkpoint(path=Path(info["checkpoint"]), step=info.get("step") or 0)
        lora = _lora_settings(Path(info["run_dir"]))
        if (
            lora is not None
        ):  # the checkpoint holds the adapters: put them on the base model, merge after loading
            from tepo.lora import LoraTargetError, apply_lora

            try:
                model = apply_lora(model, lora)
            except LoraTargetError as err:
                raise EvalError(f"{info['run_dir']}: {err}") from None
        try:
            load_checkpoint(
                checkpoint, model
            )  # also returns the optimizer/RNG state, which evaluation ignores
        except CheckpointError as err:
            raise EvalError(str(err)) from None
        if lora is not None:
            from tepo.lora import merge_lora

            model = merge_lora(model)
        model.to(device).eval()
    return model, tokenizer, info


def _lora_settings(run_dir: Path):
    """The run's ``model.lora`` (a :class:`tepo.config.LoraConfig`) when it trained LoRA adapters, else None."""
    from tepo.config import LoraConfig
    from tepo.lora import lora_config_errors

    config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    lora = (config.get("model") or {}).get("lora") if isinstance(config, dict) else None
    if not isinstance(lora, dict) or not lora.get("rank"):
        return None
    try:
        settings = LoraConfig(**lora)
    except TypeError as err:
        raise EvalError(f"{run_dir / 'config.yaml'}: model.lora is not a LoRA setting ({err})") from None
    errors = lora_config_errors(settings)
    if errors:
        raise EvalError(f"{run_dir / 'config.yaml'}: {'; '.join(errors)}")
    return settings
