"""tepo.models: the embedded model's safetensors cache, safe loading, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from helpers import write_tiny_model
from tepo.models import (
    EMBEDDED_MODEL,
    build_cached_dir,
    cache_root,
    load_gguf_model,
    load_model_and_tokenizer,
    resolve_model_path,
)

# ---------------------------------------------------------------- the embedded model


@pytest.mark.model
def test_embedded_dir_is_a_plain_safetensors_model(embedded_model_dir):
    assert embedded_model_dir.name == EMBEDDED_MODEL
    names = {p.name for p in embedded_model_dir.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert not any(n.endswith((".bin", ".gguf", ".pt")) for n in names)
    config = json.loads((embedded_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["vocab_size"] == 49_152


@pytest.mark.model
def test_converted_model_gives_identical_logits_to_the_gguf(embedded_model):
    model, tokenizer = embedded_model
    gguf_model, gguf_tokenizer = load_gguf_model()  # ~15 s: de-quantizes the GGUF
    ids = torch.tensor([tokenizer("The capital of France is Paris, and 2+2=4.")["input_ids"]])
    assert ids.tolist() == [gguf_tokenizer("The capital of France is Paris, and 2+2=4.")["input_ids"]]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, gguf_model(ids).logits)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


@pytest.mark.model
def test_embedded_aliases_and_tokenizer(embedded_model, embedded_model_dir):
    for alias in (None, "embedded", "smollm2-135m", EMBEDDED_MODEL):
        assert resolve_model_path(alias) == str(embedded_model_dir)
    model, tokenizer = embedded_model
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"  # SmolLM2 pads with its EOS
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id == 2
    assert not model.training and next(model.parameters()).dtype == torch.float32


def test_cache_root_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TEPO_CACHE_DIR", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("TEPO_CACHE_DIR")
    assert cache_root() == Path.home() / ".cache" / "tepo"


# ---------------------------------------------------------------- the atomic, locked cache


def test_concurrent_first_use_builds_once(tmp_path):
    # Two processes race for the same cache entry; the build (slow on purpose) must run once and both
    # must get the complete directory.
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from tepo.models import build_cached_dir
        def build(out):
            with open({str(tmp_path / "builds.log")!r}, "a") as log:
                log.write(str(os.getpid()) + "\\n")
            time.sleep(1.0)
            (out / "weights").write_text("complete")
        target = build_cached_dir(Path({str(tmp_path / "cache" / "m")!r}), {{"v": 1}}, build)
        print((target / "weights").read_text())
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs == ["complete", "complete"]
    assert len((tmp_path / "builds.log").read_text().split()) == 1
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name not in ("m", "m.lock")]
    assert leftovers == []


def test_partial_or_stale_dir_is_rebuilt_and_failed_build_leaves_nothing(tmp_path):
    target = tmp_path / "m"
    target.mkdir()
    (target / "half-written").write_text("x")  # no marker: an interrupted copy
    calls = []

    def build(out):
        calls.append(out)
        (out / "weights").write_text("ok")

    assert build_cached_dir(target, {"v": 1}, build) == target
    assert sorted(p.name for p in target.iterdir()) == ["tepo_conversion.json", "weights"]
    build_cached_dir(target, {"v": 1}, build)
    assert len(calls) == 1  # complete: reused
    build_cached_dir(target, {"v": 2}, build)
    assert len(calls) == 2  # stale recipe: rebuilt

    def failing(out):
        (out / "partial").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_cached_dir(tmp_path / "other", {"v": 1}, failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "m.lock", "other.lock"]


# ---------------------------------------------------------------- local paths, safety, errors


@pytest.mark.model
def test_local_tiny_model_loads_with_dtype(tmp_path, embedded_model_dir):
    reference = write_tiny_model(tmp_path / "tiny", embedded_model_dir)
    model, tokenizer = load_model_and_tokenizer(tmp_path / "tiny", dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id is not None
    torch.testing.assert_close(model.model.norm.weight.float(), reference.model.norm.weight)


@pytest.mark.model
def test_remote_code_is_refused_unless_trusted(tmp_path, embedded_model_dir):
    auto_map = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.Evil"}
    write_tiny_model(tmp_path / "evil", embedded_model_dir, extra_config={"auto_map": auto_map})
    with pytest.raises(ValueError, match=r"requests custom code \(config.json has auto_map"):
        load_model_and_tokenizer(tmp_path / "evil")
    # Trusted, it gets past tepo's check and transformers looks for the (missing) code file.
    with pytest.raises(Exception) as excinfo:
        load_model_and_tokenizer(tmp_path / "evil", trust_remote_code=True)
    assert "requests custom code" not in str(excinfo.value)


@pytest.mark.model
def test_pickle_only_weights_are_refused(tmp_path, embedded_model_dir):
    write_tiny_model(tmp_path / "pickled", embedded_model_dir, weights="bin")
    with pytest.raises(ValueError, match=r"has no \*\.safetensors weights"):
        load_model_and_tokenizer(tmp_path / "pickled")


def test_missing_or_non_model_paths_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_and_tokenizer(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model_and_tokenizer("./no/such/model")
    (tmp_path / "file.txt").write_text("hi")
    with pytest.raises(ValueError, match="is a file; expected a model directory"):
        load_model_and_tokenizer(tmp_path / "file.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"has no config\.json"):
        load_model_and_tokenizer(tmp_path / "empty")
    save_file({"w": torch.zeros(1)}, str(tmp_path / "empty" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"has no config\.json"):
        load_model_and_tokenizer(tmp_path / "empty")


def test_hub_names_pass_through():
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.slow
def test_real_concurrent_conversion(tmp_path):
    # Two processes convert the real GGUF into an empty cache at once (~40 s of CPU).
    script = "from tepo.models import embedded_model_dir; print(embedded_model_dir())"
    env = {**__import__("os").environ, "TEPO_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and outs[0] == outs[1]
    model, _ = load_model_and_tokenizer(outs[0])
    reference, _ = load_gguf_model()
    ids = torch.tensor([[1, 504, 3, 88, 2000, 12]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
