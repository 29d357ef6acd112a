"""The vLLM server's arguments per device (issue #35, item 2): CPU-sized on the CPU, GPU-sized on CUDA.

On CUDA vLLM's ``kv_cache_memory_bytes`` overrides ``gpu_memory_utilization``: passing the CPU default of 0.25 GB
there left about 9,000 tokens of cache for Qwen2.5-1.5B and made the start banner's memory split untrue; and
``enforce_eager`` turned CUDA graphs off. No GPU is needed to check the arguments that are built.
"""

from __future__ import annotations

import pytest

from tepo.rollout import vllm_server
from tepo.rollout.vllm import engine_memory_options


def _parsed(options: dict):
    argv = ["--model", "m", "--dtype", "bfloat16", "--in-fd", "3", "--out-fd", "4"]
    argv += [str(x) for item in options.items() for x in item]
    return vllm_server.parser().parse_args(argv)


def test_cpu_keeps_the_kv_budget_eager_mode_and_32_token_blocks():
    options = engine_memory_options("cpu", kv_cache_gb=0.25, gpu_memory_utilization=0.3)
    assert options == {"--enforce-eager": 1, "--kv-cache-bytes": 2**28, "--block-size": 32}
    args = _parsed(options)
    assert args.enforce_eager == 1 and args.kv_cache_bytes == 2**28 and args.block_size == 32
    # None: vLLM sizes it; eager either way
    assert engine_memory_options("cpu", kv_cache_gb=None, gpu_memory_utilization=0.3) == {
        "--enforce-eager": 1,
        "--block-size": 32,
    }


def test_the_block_size_is_the_users_where_given_and_vllms_on_cuda_otherwise():
    cpu = engine_memory_options("cpu", kv_cache_gb=0.25, gpu_memory_utilization=0.3, block_size=64)
    assert cpu["--block-size"] == 64 and _parsed(cpu).block_size == 64
    assert "--block-size" not in engine_memory_options("cuda", kv_cache_gb=None, gpu_memory_utilization=0.3)
    cuda = engine_memory_options("cuda", kv_cache_gb=None, gpu_memory_utilization=0.3, block_size=16)
    assert cuda["--block-size"] == 16
    assert _parsed({}).block_size is None  # the server alone leaves it to vLLM


def test_rollout_vllm_block_size_is_a_checked_config_key():
    from tepo.config import ConfigError, load_config

    assert load_config("default", []).rollout.vllm.block_size is None
    assert load_config("default", ["rollout.vllm.block_size=64"]).rollout.vllm.block_size == 64
    for bad in ("0", "-32", "true"):
        with pytest.raises(ConfigError, match=r"rollout\.vllm\.block_size"):
            load_config("default", [f"rollout.vllm.block_size={bad}"])


def test_cuda_sizes_the_cache_from_the_utilization_and_keeps_cuda_graphs():
    options = engine_memory_options("cuda", kv_cache_gb=0.25, gpu_memory_utilization=0.45)
    assert "--kv-cache-bytes" not in options  # it would override the utilization
    assert options == {"--gpu-memory-utilization": 0.45, "--enforce-eager": 0}
    args = _parsed(options)
    assert args.enforce_eager == 0 and args.kv_cache_bytes is None and args.gpu_memory_utilization == 0.45


def test_the_server_defaults_to_eager_when_not_told():
    assert _parsed({}).enforce_eager == 1


def test_cpu_compiles_only_when_asked_and_cuda_is_unchanged_by_it():
    options = engine_memory_options("cpu", kv_cache_gb=0.25, gpu_memory_utilization=0.3, compile_cpu=True)
    assert options == {"--enforce-eager": 0, "--kv-cache-bytes": 2**28, "--block-size": 32}
    assert _parsed(options).enforce_eager == 0
    cuda = engine_memory_options("cuda", kv_cache_gb=0.25, gpu_memory_utilization=0.3, compile_cpu=True)
    assert cuda == engine_memory_options("cuda", kv_cache_gb=0.25, gpu_memory_utilization=0.3)


def test_the_compiled_engine_keeps_its_cache_under_tepos_cache_root_with_aot_off(tmp_path, monkeypatch):
    from tepo.rollout.vllm_launch import compile_cache_dir, compile_env

    monkeypatch.setenv("TEPO_CACHE_DIR", str(tmp_path))
    cache = compile_cache_dir()
    assert cache == str(tmp_path / "compile")
    env = compile_env(cache)
    # vLLM 0.32's AOT artifact cannot be loaded back on the CPU: with it on, every start recompiled (about 60 s).
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(cache) and env["VLLM_CACHE_ROOT"].startswith(cache)


def test_rollout_vllm_compile_is_a_config_key_off_by_default():
    from tepo.config import load_config

    assert load_config("default", []).rollout.vllm.compile is False
    assert load_config("default", ["rollout.vllm.compile=true"]).rollout.vllm.compile is True
