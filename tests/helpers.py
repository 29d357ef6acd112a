"""Plain helpers shared by several test modules (fixtures are in conftest.py): ``from helpers import ...``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tiny_llama(seed: int = 0, *, tie: bool = False, vocab_size: int = 97, **config):
    """A real (randomly initialised) 2-layer Llama small enough for exact float32 checks in milliseconds;
    ``config`` overrides ``LlamaConfig`` fields (``max_position_embeddings`` 64, ``pad_token_id`` 0, ...)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    fields = dict(num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie, pad_token_id=0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, **shape, **{**fields, **config})).eval()


def write_tiny_llama(directory: Path, tokenizer, **config) -> Path:
    """`tiny_llama` (seed 0) sized to ``tokenizer`` (its vocabulary, pad and eos ids) and saved with it in
    ``directory``, like any checkpoint; ``config`` as for `tiny_llama`."""
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    tiny_llama(0, vocab_size=len(tokenizer), **{**ids, **config}).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def vllm_python_or_skip() -> str:
    """The Python that runs vLLM, or skip the test (with the reason) where vLLM is not installed."""
    from tepo.rollout.vllm import VLLMServerError, find_vllm_python

    try:
        return find_vllm_python()
    except VLLMServerError as err:
        pytest.skip(f"vLLM is not installed: {err}")


def raise_one_answer(model, tokenizer, steps: int = 6, lr: float = 5e-3) -> None:
    """A few AdamW steps raising the log-prob of one fixed answer (a large lr: a clear change of the policy)."""
    import torch

    ids = tokenizer("What is 2 + 2? The answer is 4, of course.", return_tensors="pt")["input_ids"]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def small_run_overrides(tmp_path, *extra: str) -> list[str]:
    """Config overrides of a few-second training run on the HF backend (the trainer's logic; the vLLM backend has
    its own run in tests/rollout/test_rollout_vllm.py): 2 prompts x 3 samples of 8 tokens, micro-batches of 4, 2
    held-out problems, a checkpoint every step, one reward worker, no progress bar; then ``extra`` (later
    overrides win)."""
    run = [f"train.output_dir={tmp_path}", "rollout.backend=hf", "eval.size=2", "train.save_every=1"]
    sizes = ["train.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=8"]
    quiet = ["train.micro_batch_size=4", "reward.num_workers=1", "log.progress=false"]
    return [*run, *sizes, *quiet, *extra]


def small_vllm_run_overrides(tmp_path, python: str) -> list[str]:
    """Config overrides of a few-second training run on the real vLLM engine (2 prompts x 3 samples, 8 tokens,
    one micro-batch, no checkpoints); tests append what they check (later overrides win)."""
    return [
        f"train.output_dir={tmp_path}",
        "rollout.backend=vllm",
        f"rollout.vllm.python={python}",
        "train.prompts_per_step=2",
        "rollout.group_size=3",
        "rollout.max_new_tokens=8",
        "train.micro_batch_size=6",
        "train.save_every=0",
        "train.save_final=false",
        "reward.num_workers=1",
        "log.progress=false",
        "algorithm.entropy_coef=0.01",  # a non-zero gradient whatever the rewards
    ]


def one_window_grpo_config(tmp_path, completion_tokens: int, **settings):
    """The ``GRPOConfig`` of the TRL parity tests: CPU, float32, one window of 4 completions (2 prompts x 2 samples)
    per optimizer step, no accumulation, nothing logged or saved, seed 0; ``settings`` add to or override it."""
    from trl import GRPOConfig

    base = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        per_device_train_batch_size=4,
        num_generations=2,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_completion_length=completion_tokens,
        report_to="none",
        save_strategy="no",
        bf16=False,
        seed=0,
    )
    base.update(settings)
    return GRPOConfig(**base)


def config_error_lines(overrides: list[str]) -> list[str]:
    """The lines of the ``ConfigError`` that ``load_config(None, overrides)`` must raise: a header, then one line a
    problem (``  - key: message``)."""
    from tepo.config import ConfigError, load_config

    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    return str(caught.value).splitlines()


def load_script(name: str):
    """``scripts/<name>.py`` as a module: the scripts are not a package, their tests call ``main(argv)``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_rollout_batch(
    groups: int, group_size: int, prompt: int, response: int, *, seed: int = 1, vocab: int = 32
):
    """A ``RolloutBatch`` of ``groups`` prompts (``prompt`` random ids each) x ``group_size`` responses of random
    lengths 1..``response`` (ids < ``vocab``, padded with 0 after each response's end), rows grouped by prompt."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = groups * group_size
    prompts = torch.randint(1, vocab, (groups, prompt), generator=gen).repeat_interleave(group_size, 0)
    lengths = torch.randint(1, response + 1, (n,), generator=gen)
    ids = torch.randint(1, vocab, (n, response), generator=gen)
    rmask = (torch.arange(response)[None] < lengths[:, None]).float()
    ids = torch.where(rmask.bool(), ids, torch.zeros_like(ids))
    att = torch.cat([torch.ones(n, prompt, dtype=torch.long), rmask.long()], 1)
    return rollout_batch_of(torch.cat([prompts, ids], 1), att, rmask, group_size)


def rollout_batch_of(input_ids, attention_mask, response_mask, group_size: int, **fields):
    """A ``RolloutBatch`` of these tensors, rows grouped by prompt in groups of ``group_size``: no texts, nothing
    truncated, no generation time unless ``fields`` say otherwise (they also add the rest: ``rollout_logp`` ...)."""
    import torch

    from tepo.rollout.base import RolloutBatch

    n, response = response_mask.shape
    fields = dict(texts=[""] * n, truncated=torch.zeros(n, dtype=torch.bool), gen_seconds=0.0) | fields
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        response_len=response,
        prompt_index=torch.arange(n) // group_size,
        num_generated_tokens=int(response_mask.sum()),
        **fields,
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def write_tiny_model(
    directory: Path, embedded_dir: Path, *, extra_config: dict | None = None, weights="safetensors"
):
    """A tiny random Llama (1 layer, tied embeddings) with the embedded tokenizer: a real, loadable local model
    directory; ``weights="bin"`` saves a pickled ``pytorch_model.bin`` instead of safetensors, ``extra_config``
    adds keys to its config.json."""
    import json
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49_152, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    directory.mkdir(parents=True)
    model.save_pretrained(directory)
    if weights == "bin":
        state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
        torch.save(state, directory / "pytorch_model.bin")
        (directory / "model.safetensors").unlink()
    if extra_config:
        data = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps({**data, **extra_config}))
    for name in TOKENIZER_FILES:
        shutil.copy(embedded_dir / name, directory / name)
    return model


def nucleus_logprobs(logits, temperature: float, top_p: float):
    """``log`` of the sampling distribution: ``softmax(logits / T)`` restricted to its top-p nucleus, renormalised.

    The nucleus: going from the least likely token up, drop tokens while their cumulative probability is
    ``<= 1 - top_p``; the most likely token always stays. Dropped tokens get ``-inf``.
    """
    import math

    import torch

    probs = torch.softmax(logits.float() / temperature, -1)
    ascending, order = probs.sort(-1)
    drop_sorted = ascending.cumsum(-1) <= 1 - top_p
    drop_sorted[..., -1] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    kept = torch.log_softmax(logits.float() / temperature, -1).masked_fill(drop, -math.inf)
    return kept - kept.logsumexp(-1, keepdim=True)


def next_token_logits(model, batch):
    """``[N, T, V]`` float32 logits the model gives each response position (same positions as generation)."""
    import torch

    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=position_ids
        ).logits
    p, t = batch.prompt_len, batch.response_len
    return logits[:, p - 1 : p + t - 1].float()


def chat_prompt_ids(tokenizer, questions: list[str]) -> list[list[int]]:
    """Each question as one user turn through the tokenizer's chat template (generation prompt added): token ids."""
    turns = ([{"role": "user", "content": q}] for q in questions)
    return [list(tokenizer.apply_chat_template(t, add_generation_prompt=True)["input_ids"]) for t in turns]


def check_rollout_logp(model, batch, temperature: float, top_p: float, atol: float):
    """Assert that a sampler's ``batch.rollout_logp`` is each sampled token's log-probability under ``model``'s
    nucleus at ``temperature`` / ``top_p`` (`nucleus_logprobs` of `next_token_logits`, to ``atol``) and 0 on
    padding; returns ``(logits, tokens, mask)`` for the caller's further checks."""
    import torch

    logits = next_token_logits(model, batch)
    tokens = batch.response_ids.unsqueeze(-1)
    want = nucleus_logprobs(logits, temperature, top_p).gather(-1, tokens).squeeze(-1)
    mask = batch.response_mask.bool()
    assert torch.isfinite(want[mask]).all(), "a sampled token lies outside the reference nucleus"
    torch.testing.assert_close(batch.rollout_logp[mask], want[mask], atol=atol, rtol=0)
    assert (batch.rollout_logp[~mask] == 0).all()
    return logits, tokens, mask


def run_torchrun_worker(script: str, *args: str, processes: int = 2, timeout: int = 600) -> None:
    """Run ``script`` (a test file that is also its own worker) under torchrun with ``processes`` processes, one
    thread each, and fail with the end of its output unless it exits 0."""
    import os
    import subprocess
    import sys

    # The worker is a test module run as a script: it imports this file, so tests/ goes on its path.
    path = os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": path}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
        script, *args,
    ]  # fmt: skip
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
