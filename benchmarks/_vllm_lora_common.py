"""What the three programs of benchmarks/bench_vllm_lora.py share: the adapter's shape, the prompts, the limits."""

from __future__ import annotations

import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
RANK = 16
ALPHA = 16.0
REF_TOKENS = 32  # greedy continuation length of the correctness check
TOP_LOGPROBS = 20  # vLLM's default max_logprobs
KV_CACHE_BYTES = 256 * 2**20  # tepo's default rollout.vllm.kv_cache_gb = 0.25
PROMPTS = [
    "What is 17 times 23? Think step by step.",
    "Write a haiku about the sea.",
    "Name three prime numbers greater than 50 and explain why they are prime.",
    "Explain in two sentences why the sky is blue.",
]


def median(values):
    return statistics.median(values) if values else float("nan")


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]
