"""LoRA training (``model.lora``): wrap the policy with peft adapters, save/load only them, export merged weights.

LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", Eq. 3) replaces a frozen weight
``W0`` (out x in) by ``W = W0 + (alpha / r) * B @ A`` with ``A`` (r x in), ``B`` (out x r), ``B = 0`` at start, so
the adapted model starts exactly at the base model and only ``A`` and ``B`` are trained (and hold optimizer state).

The adapters are peft's (``peft.get_peft_model``); this module is the one place tepo touches peft:

- :func:`lora_config_errors`: checks of ``model.lora`` before any model loads (rank, alpha, dropout, the module
  names' form, peft installed).
- :func:`apply_lora`: wraps a loaded model; a target module the model does not have is refused here, naming the key.
- :func:`adapter_state_dict` / :func:`is_lora`: what a checkpoint holds for a LoRA run (the adapter only).
- :func:`merged_state_dict`: ``W0 + (alpha / r) B A`` under the base model's parameter names, without changing the
  model: what a rollout engine (vLLM) loads and what ``tepo eval`` evaluates.
- :class:`AdaptersOff` / :func:`scoring`: the reference policy of a LoRA run (KL term, reference-based
  estimators) as the policy itself with its adapters switched off, instead of a second copy of the base model.

Dropout (``model.lora.dropout``) is peft's: applied to the adapter's input in train mode only. The trainer scores
log-probs in train mode, so with dropout > 0 the scored policy is a random sub-network of the sampled one; the
default 0 keeps both the same.
"""

from __future__ import annotations

import contextlib

import torch

ALL_LINEAR = "all-linear"  # peft's keyword: every linear layer except the output head


def target_modules(value) -> str | list[str]:
    """``model.lora.target_modules`` as peft takes it: ``"all-linear"`` or a list of module names.

    Accepts a comma-separated string (``q_proj,v_proj``, for ``key=value`` overrides) or a YAML list.
    """
    if isinstance(value, str):
        if value.strip() == ALL_LINEAR:
            return ALL_LINEAR
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(part).strip() for part in value]


def lora_config_errors(lora) -> list[str]:
    """Problems with ``model.lora`` (a :class:`tepo.config.LoraConfig`), one message each; empty when valid."""
    errors = []
    if lora.rank < 0:
        errors.append(f"model.lora.rank: must be >= 0 (0: LoRA off, full fine-tuning), got {lora.rank}")
    if lora.rank <= 0:
        return errors
    if not lora.alpha > 0:
        errors.append(f"model.lora.alpha: must be > 0, got {lora.alpha}")
    if not 0 <= lora.dropout < 1:
        errors.append(f"model.lora.dropout: must be in [0, 1), got {lora.dropout}")
    value = lora.target_modules
    if not isinstance(value, str | list) or (
        isinstance(value, list) and not all(isinstance(v, str) for v in value)
    ):
        errors.append(
            f"model.lora.target_modules: expected {ALL_LINEAR!r}, a comma-separated string or a list of module "
            f"names, got {value!r}"
        )
    elif not target_modules(value):
        errors.append("model.lora.target_modules: empty; name the modules to adapt (e.g. q_proj,v_proj)")
    try:
        import peft  # noqa: F401
    except ImportError:
        errors.append(
            "model.lora.rank > 0 needs the peft package, which is not installed: pip install 'tepo[lora]'"
        )
    return errors


class LoraTargetError(ValueError):
    """``model.lora.target_modules`` does not fit the loaded model (checked once it is loaded)."""


def apply_lora(model, lora):
    """``model`` wrapped with LoRA adapters per ``lora`` (``model.lora``); only the adapters require grad.

    Raises :class:`LoraTargetError` (the trainer reports it as a config error) naming ``model.lora.target_modules`` when a named module is not in the
    model, or peft cannot adapt it (not a linear/embedding/conv layer).
    """
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    targets = target_modules(lora.target_modules)
    if targets != ALL_LINEAR:
        leaf_names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}
        missing = [t for t in targets if t not in leaf_names]
        if missing:
            linear = sorted(
                {
                    name.rsplit(".", 1)[-1]
                    for name, module in model.named_modules()
                    if isinstance(module, torch.nn.Linear)
                }
            )
            raise LoraTargetError(
                f"model.lora.target_modules: the model ({type(model).__name__}) has no module named "
                f"{', '.join(missing)}; its linear layers are {', '.join(linear)} (or use {ALL_LINEAR!r})"
            )
    config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, config)
    except (ValueError, TypeError) as err:
        raise LoraTargetError(f"model.lora.target_modules: peft cannot adapt {targets!r}: {err}") from None


def is_lora(model) -> bool:
    """Whether ``model`` is a peft-wrapped model (``model.lora.rank > 0``)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def adapter_state_dict(model) -> dict[str, torch.Tensor]:
    """The trained parameters of a LoRA model, under the wrapped model's own names (what a checkpoint holds)."""
    return {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The adapted weights ``W0 + (alpha/r) B A`` under the base model's names; ``model.state_dict()`` without LoRA.

    The model is not changed (no merge in place), so training continues on the unmerged adapters.
    """
    if not is_lora(model):
        return model.state_dict()
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer) or module.merged:
                continue
            for adapter in module.active_adapters:
                if adapter in module.lora_A or adapter in getattr(module, "lora_embedding_A", {}):
                    delta = module.get_delta_weight(adapter)
                    key = f"{name}.weight"
                    deltas[key] = deltas[key] + delta if key in deltas else delta
        out = {}
        for key, tensor in base.state_dict().items():
            if ".lora_" in key:
                continue
            key = key.replace(".base_layer.", ".")
            out[key] = (tensor + deltas[key].to(tensor.dtype)) if key in deltas else tensor.detach()
    return out


def merge_lora(model):
    """The plain model with the adapters merged into its weights (for evaluation); ``model`` without LoRA."""
    if not is_lora(model):
        return model
    return model.merge_and_unload()


class AdaptersOff:
    """The reference policy of a LoRA run: the policy's own modules with its adapters switched off.

    With the adapters off (peft's ``disable_adapter``) every adapted layer computes ``W0 x``, the frozen base
    weights: exactly the initial policy (``B = 0`` at start, Eq. 3) and the reference a copy of the base model
    taken before the adapters went in would give, for as long as training runs (``W0`` never changes; a resumed
    run has the same ``W0``). No second model is kept: the copy cost the size of the base model (540 MB for the
    embedded model in float32, 15 GB for a 7B model in bfloat16). Score through :func:`scoring`; the policy
    is in eval mode while it is the reference, as the copy was (the supported models have no dropout, and LoRA's
    own dropout sits on the switched-off adapter path), and back in its own mode after.
    """

    def __init__(self, model):
        if not is_lora(model):
            raise TypeError(f"AdaptersOff needs a peft-wrapped LoRA model, got {type(model).__name__}")
        self.model = model

    @contextlib.contextmanager
    def active(self):
        """The model as the reference for the duration of the block (adapters off, eval mode)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                yield self.model
        finally:
            self.model.train(was_training)


def scoring(reference):
    """A context yielding the module that scores the reference policy: ``reference`` itself when it is a model
    (a frozen copy), the policy with its adapters off when it is an :class:`AdaptersOff`."""
    if isinstance(reference, AdaptersOff):
        return reference.active()
    return contextlib.nullcontext(reference)
