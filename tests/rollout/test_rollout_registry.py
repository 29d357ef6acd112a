"""tepo.rollout.registry: one table gives the backend names, config validation, ``tepo eval`` choices and the
construction from config; every registered backend states the whole :class:`RolloutBackend` contract."""

from __future__ import annotations

import inspect

import pytest

from tepo.config import ConfigError, HfRolloutConfig, ModelConfig, RolloutConfig, VllmConfig, load_config
from tepo.rollout import (
    RolloutBackend,
    make_rollout_from_config,
    register_rollout_backend,
    rollout_backend_choices,
    rollout_backend_class,
    rollout_backend_names,
)
from tepo.rollout import registry as registry_module

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MISSING_PYTHON = "/nonexistent/bin/python"


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test (which may register more backends)."""
    monkeypatch.setattr(registry_module, "_BACKENDS", dict(registry_module._BACKENDS))
    return registry_module


def test_names_validation_and_eval_choices_come_from_the_registry(registry):
    import argparse

    from tepo.evaluate.cli import register

    assert rollout_backend_names() == ("hf", "vllm")
    assert rollout_backend_choices() == ("hf", "vllm", "auto")
    with pytest.raises(ConfigError, match=r"rollout.backend: expected hf, vllm or auto, got 'sglang'"):
        load_config("default", ["rollout.backend=sglang"])

    class Sglang:
        def generate(self, prompt_ids, **kw): ...

    with pytest.raises(
        TypeError, match=r"'sglang' \(.*Sglang\) lacks from_config, availability, config_errors"
    ):
        register_rollout_backend("sglang", Sglang)

    from tepo.rollout.hf import HFRollout

    register_rollout_backend("sglang", type("Sglang", (HFRollout,), {}))
    assert rollout_backend_choices() == ("hf", "vllm", "sglang", "auto")
    assert load_config("default", ["rollout.backend=sglang"]).rollout.backend == "sglang"
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    eval_parser = sub.choices["eval"]
    rollout_action = next(a for a in eval_parser._actions if a.dest == "rollout")
    assert tuple(rollout_action.choices) == ("hf", "vllm", "sglang", "auto")


def test_registration_errors(registry):
    with pytest.raises(ValueError, match="already registered"):
        register_rollout_backend("hf", "tepo.rollout.hf:HFRollout")
    with pytest.raises(ValueError, match="other than 'auto'"):
        register_rollout_backend("auto", "x:Y")
    with pytest.raises(ValueError, match="'module:Class'"):
        register_rollout_backend("mine", "tepo.rollout.hf.HFRollout")
    with pytest.raises(ValueError, match=r"unknown rollout backend 'nope'; expected one of \['hf', 'vllm'\]"):
        rollout_backend_class("nope")


def test_backend_keys_are_validated_by_their_backend_whatever_the_choice():
    bad = ["rollout.backend=hf", "rollout.hf.max_batch_size=0", "rollout.vllm.dtype=int8"]
    bad += ["rollout.vllm.kv_cache_gb=0", "rollout.vllm.max_model_len=0"]
    with pytest.raises(ConfigError) as err:
        load_config("default", bad)
    message = str(err.value)
    for key in (
        "hf.max_batch_size: must be >= 1",
        "vllm.dtype: expected auto, bfloat16",
        "vllm.kv_cache_gb: must be",
    ):
        assert f"rollout.{key}" in message
    assert "rollout.vllm.max_model_len: must be >= 1" in message


def test_one_source_of_defaults():
    """A run without a preset and a run of the default preset get the same model and rollout settings."""
    preset = load_config()
    assert preset.rollout == RolloutConfig() and preset.model == ModelConfig()
    assert RolloutConfig().backend == "auto" and RolloutConfig().autocast_bf16 == "auto"


@pytest.mark.parametrize("name", rollout_backend_names())
def test_every_registered_backend_states_the_whole_contract(name):
    cls = rollout_backend_class(name)
    for method in ("generate", "weights_updated", "close", "__enter__", "__exit__"):
        assert callable(getattr(cls, method, None)), f"{name} lacks {method}"
    for hook in ("from_config", "availability", "config_errors"):
        assert isinstance(inspect.getattr_static(cls, hook), classmethod), (
            f"{name}.{hook} is not a classmethod"
        )
    want = inspect.signature(RolloutBackend.generate).parameters
    got = inspect.signature(cls.generate).parameters
    assert [(p.name, p.kind, p.default) for p in got.values()] == [
        (p.name, p.kind, p.default) for p in want.values()
    ]
    hook = inspect.signature(cls.from_config).parameters
    assert list(hook) == ["rollout_config", "model", "tokenizer", "seed", "run_dir", "log"]
    assert hook["seed"].kind is inspect.Parameter.KEYWORD_ONLY
    assert cls.config_errors(RolloutConfig()) == []


@pytest.mark.model
def test_make_rollout_from_config_builds_and_logs_the_choice(embedded_model):
    from tepo.precision import native_bf16
    from tepo.rollout import HFRollout

    model, tokenizer = embedded_model
    lines = []
    config = RolloutConfig(backend="hf", autocast_bf16=False, hf=HfRolloutConfig(max_batch_size=4))
    with make_rollout_from_config(config, model, tokenizer, seed=0, log=lines.append) as backend:
        assert isinstance(backend, HFRollout) and isinstance(backend, RolloutBackend)
        assert backend.autocast_bf16 is False and backend.max_batch_size == 4
        assert backend.last_sync_seconds is None and backend.pad_token_id == tokenizer.pad_token_id
        assert backend.parity_guard is None  # no engine of its own: nothing to check (#45: no getattr)
    assert lines == ["rollout: hf (rollout.backend=hf)"]

    # auto without a usable vLLM: hf, and the log says why vllm was passed over.
    lines.clear()
    config = RolloutConfig(backend="auto", vllm=VllmConfig(python=MISSING_PYTHON))
    backend = make_rollout_from_config(config, model, tokenizer, seed=0, log=lines.append)
    # rollout.autocast_bf16=auto: bf16 where the CPU computes it natively (tepo.precision)
    assert isinstance(backend, HFRollout) and backend.autocast_bf16 is native_bf16("cpu").native
    assert len(lines) == 1 and lines[0].startswith("rollout: hf (rollout.backend=auto: transformers generate")
    assert f"not vllm: vLLM interpreter '{MISSING_PYTHON}' does not exist" in lines[0]


@pytest.mark.model
def test_auto_prefers_the_available_backend_with_the_highest_priority(registry, embedded_model):
    """A registered backend is a class with the hooks; "auto" asks each candidate, best first."""
    from tepo.rollout.hf import HFRollout

    class Preferred(HFRollout):
        usable = True

        @classmethod
        def availability(cls, rollout_config):
            return cls.usable, "here" if cls.usable else "switched off"

    register_rollout_backend("preferred", Preferred, auto_priority=100)
    model, tokenizer = embedded_model
    config = RolloutConfig(backend="auto", vllm=VllmConfig(python=MISSING_PYTHON))
    lines = []
    backend = make_rollout_from_config(config, model, tokenizer, seed=0, log=lines.append)
    assert type(backend) is Preferred and lines == ["rollout: preferred (rollout.backend=auto: here)"]
    Preferred.usable = False
    lines.clear()
    backend = make_rollout_from_config(config, model, tokenizer, seed=0, log=lines.append)
    assert type(backend) is HFRollout
    assert "not preferred: switched off; not vllm:" in lines[0]
