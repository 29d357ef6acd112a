"""``train.device`` (tepo.device) and the device bugs a CPU run cannot see.

- A static check: every tensor factory call in the step's modules passes ``device=`` or derives its tensor from an
  input (``*_like``, ``x.new_*``); the few that stay on the host on purpose are listed in ``HOST_ON_PURPOSE``, each
  with its reason, and an entry that no longer matches a call fails the test too.
- The same rule, observed: the update phase of a tiny model, run under a mode that records every factory call made
  from tepo's code without a device; each must be one of those entries.
- The log-prob kernel's forward and hand-written backward on the ``meta`` device (the rest of the update reads values,
  ``.item()``, which ``meta`` tensors do not have, so it cannot run there).
- ``train.device``'s forms, its refusal on a machine without the device (one line, exit 2, before any model loads),
  the bf16-weights option's refusal on the CPU, and the CUDA RNG state in checkpoints.
The CUDA tests proper are in tests/test_gpu.py (``-m gpu``; they skip without a GPU).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from helpers import rollout_batch_of, tiny_llama
from tepo.config import ConfigError, load_config
from tepo.device import device_setting_error, resolve_device
from update_runs import apply_update

SRC = Path(__file__).resolve().parents[1] / "src" / "tepo"
STEP_MODULES = ["training", "losses", "advantages", "rollout", "logprobs.py", "batch.py"]
FACTORIES = {
    "zeros", "ones", "full", "empty", "arange", "range", "linspace", "logspace", "eye", "tensor", "as_tensor",
    "randn", "rand", "randint", "randperm", "normal", "empty_strided", "scalar_tensor", "tril_indices",
    "triu_indices",
}  # fmt: skip

# (file under src/tepo, the call as ast.unparse writes it) -> why it is on the host on purpose.
HOST_ON_PURPOSE = {
    ("training/collect.py", "torch.tensor([float(w) for _, w in reward_functions], dtype=torch.float32)"): (
        "the reward functions' weights: a few floats built once per collection, moved to the rewards' device "
        "where they meet them"
    ),
    (
        "rollout/weight_sync.py",
        "torch.empty((), dtype=dtype)",
    ): "a scalar read for its element size only, never computed on",
    ("training/update.py", "torch.randperm(num_groups, generator=generator)"): (
        "row indices: drawn from the step's CPU generator, so one seed shuffles the groups alike on every device "
        "(a device tensor may be indexed with host indices)"
    ),
    ("training/update.py", "torch.arange(num_groups)"): "row indices of the one-epoch order (as above)",
    ("training/update.py", "torch.arange(group_size)"): "row indices within a group (as above)",
    ("training/logprob_pass.py", "torch.arange(n)"): "row indices of the micro-batches (as above)",
    ("advantages/_common.py", "torch.as_tensor(rewards)"): (
        "a caller's plain list of rewards (a tensor never reaches this line: it is checked just above)"
    ),
    ("advantages/filtering.py", "torch.as_tensor(keep_mask, dtype=torch.bool)"): (
        "a tensor keeps its device; a caller's list becomes a host mask, moved to the rows' device where used"
    ),
    ("advantages/filtering.py", "torch.as_tensor(correct)"): "moved to the rewards' device on the same line",
}


def _step_files() -> list[Path]:
    files = []
    for name in STEP_MODULES:
        path = SRC / name
        files += sorted(path.glob("*.py")) if path.is_dir() else [path]
    return files


def _factory_calls_without_device(path: Path) -> list[tuple[int, int, str]]:
    """``(first line, last line, source)`` of each ``torch.<factory>(...)`` call in ``path`` without ``device=``."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in FACTORIES
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and not any(k.arg == "device" for k in node.keywords)
        ):
            calls.append((node.lineno, node.end_lineno, ast.unparse(node)))
    return calls


def test_every_tensor_factory_of_the_step_names_its_device():
    offenders, matched = [], set()
    for path in _step_files():
        rel = path.relative_to(SRC).as_posix()
        for line, _, source in _factory_calls_without_device(path):
            if (rel, source) in HOST_ON_PURPOSE:
                matched.add((rel, source))
            else:
                offenders.append(f"src/tepo/{rel}:{line}: {source}")
    assert not offenders, (
        "tensor factory calls without device= (pass device=<an input>.device, use *_like / x.new_*, or add the "
        "call to HOST_ON_PURPOSE with its reason):\n" + "\n".join(offenders)
    )
    stale = sorted(set(HOST_ON_PURPOSE) - matched)
    assert not stale, f"HOST_ON_PURPOSE entries that match no call any more (remove them): {stale}"


def test_the_static_check_sees_a_factory_without_device(tmp_path):
    path = tmp_path / "example.py"
    path.write_text(
        "import torch\nx = torch.zeros(\n    2, 3\n)\ny = torch.ones(2, device=x.device)\nz = x.new_zeros(2)\n"
    )
    assert _factory_calls_without_device(path) == [(2, 4, "torch.zeros(2, 3)")]


class _DevicelessFactories(TorchFunctionMode):
    """Records ``(file, line)`` of every factory call made from tepo's code without ``device=``."""

    def __init__(self):
        super().__init__()
        self.seen: set[tuple[str, int]] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in FACTORIES and "device" not in kwargs:
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(str(SRC)):
                self.seen.add((frame.f_code.co_filename, frame.f_lineno))
        return func(*args, **kwargs)


def test_the_update_phase_creates_no_tensor_without_a_device(one_torch_thread):
    """A step's phases after sampling (old-policy pass, advantages, correction, update, mismatch metrics) on a tiny
    model: each device-less factory call they make is one of HOST_ON_PURPOSE's."""
    from tepo.advantages import compute_advantages
    from tepo.losses.rollout_correction import rollout_correction_weights, rollout_mismatch_metrics
    from tepo.training.logprob_pass import LogprobSettings, batch_logprobs
    from tepo.training.plan import UpdatePlan, UpdateSettings

    groups, g, p, t = 2, 3, 3, 4
    n = groups * g
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, 90, (groups, p), generator=gen).repeat_interleave(g, 0)
    ids = torch.cat([prompts, torch.randint(1, 90, (n, t), generator=gen)], 1)
    att = torch.ones(n, p + t, dtype=torch.long)
    batch = rollout_batch_of(ids, att, torch.ones(n, t), g, rollout_logp=torch.full((n, t), -4.0))
    model = tiny_llama(0).train()
    settings = LogprobSettings(n, 1.0, False, True, "auto")  # float32: ms on a busy CPU
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _u: 1.0)
    recorder = _DevicelessFactories()
    with recorder:
        old_logp, old_entropy, _ = batch_logprobs(model, batch, settings, entropy=True)
        rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], device=ids.device)
        advantages = compute_advantages("grpo", rewards, g, mask=batch.response_mask)
        weights, keep, _ = rollout_correction_weights(
            old_logp, batch.rollout_logp, batch.response_mask, mode="tis"
        )
        plan = UpdatePlan(UpdateSettings("tepo", {}, 2, groups, g, 1.0, float(t)), settings)
        rows = dict(advantages=advantages, mask=batch.response_mask * keep, is_weights=weights)
        rows.update(old_logp=old_logp, old_entropy=old_entropy)
        apply_update(model, optimizer, batch, plan, scheduler=scheduler, **rows)
        rollout_mismatch_metrics(old_logp, batch.rollout_logp, batch.response_mask)
    allowed = set()
    for rel, _ in HOST_ON_PURPOSE:
        path = SRC / rel
        for first, last, source in _factory_calls_without_device(path):
            if (rel, source) in HOST_ON_PURPOSE:
                allowed |= {(str(path), line) for line in range(first, last + 1)}
    assert recorder.seen, "the recorder saw no factory call at all: it is not recording"
    unexpected = sorted(recorder.seen - allowed)
    assert not unexpected, f"device-less tensor factories in the update phase: {unexpected}"


def test_log_prob_kernel_and_its_backward_run_on_meta():
    """The hand-written backward allocates only from its inputs: forward and backward on ``meta`` stay there."""
    from tepo.logprobs import _TargetLogpAndEntropy

    meta = torch.device("meta")
    logits = torch.empty(6, 11, device=meta, requires_grad=True)
    targets = torch.empty(6, dtype=torch.long, device=meta)
    logp, entropy = _TargetLogpAndEntropy.apply(logits, targets, 0.7, True)
    assert logp.device == entropy.device == meta
    (logp.sum() + entropy.sum()).backward()
    assert logits.grad.device == meta and logits.grad.shape == (6, 11)


def test_rollout_batch_moves_to_a_device_and_stays_put_on_the_cpu():
    from tepo.rollout.base import RolloutBatch

    batch = RolloutBatch(
        input_ids=torch.ones(2, 3, dtype=torch.long),
        attention_mask=torch.ones(2, 3, dtype=torch.long),
        response_mask=torch.ones(2, 1),
        response_len=1,
        prompt_index=torch.arange(2),
        texts=["a", "b"],
        truncated=torch.zeros(2, dtype=torch.bool),
        gen_seconds=1.5,
        num_generated_tokens=2,
        rollout_logp=torch.zeros(2, 1),
    )
    assert batch.to("cpu") is batch  # no copy: a CPU run does exactly what it did
    moved = batch.to("meta")
    for name in ("input_ids", "attention_mask", "response_mask", "prompt_index", "truncated", "rollout_logp"):
        assert getattr(moved, name).device.type == "meta", name
    assert (moved.texts, moved.gen_seconds, moved.response_len) == (batch.texts, 1.5, 1)


# ---- train.device -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["auto", "cpu", "cuda", "cuda:0", "cuda:3"])
def test_device_forms_accepted(setting):
    assert device_setting_error(setting) is None
    assert load_config(None, [f"train.device={setting}"]).train.device == setting


@pytest.mark.parametrize("setting", ["gpu", "cuda:", "cuda:x", "CPU", "mps", 0])
def test_device_forms_refused_with_one_message(setting):
    with pytest.raises(ConfigError, match=r"train\.device: expected"):
        load_config(None, [f"train.device={setting}"])


def test_auto_and_cpu_resolve_here():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")


def test_missing_cuda_and_a_missing_index_are_one_line_each(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^train.device=cuda: this machine has no CUDA device") as err:
        resolve_device("cuda")
    assert "\n" not in str(err.value)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(ValueError, match=r"train.device=cuda:1: this machine has 1 CUDA device"):
        resolve_device("cuda:1")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the refusal is for one without")
def test_tepo_train_on_cuda_without_cuda_is_one_line_exit_2_before_any_model_loads(
    tmp_path, monkeypatch, capsys
):
    import tepo.models
    import tepo.training.trainer
    from tepo.cli import main

    def refuse(*_a, **_k):
        raise AssertionError("loaded something before refusing the device")

    monkeypatch.setattr(tepo.models, "load_model_and_tokenizer", refuse)
    monkeypatch.setattr(tepo.training.trainer, "load_datasets", refuse)
    code = main(["train", "train.device=cuda", "--output-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(
        "tepo: error: train.device=cuda: this machine has no CUDA"
    ), err
    assert not (tmp_path / "runs").exists()  # no run directory left behind


def test_bf16_weights_are_refused_on_the_cpu():
    with pytest.raises(ConfigError, match=r"model\.dtype=bfloat16 .* on the CPU use model\.dtype=float32"):
        load_config(None, ["model.dtype=bfloat16", "train.device=cpu"])
    with pytest.raises(ConfigError, match=r"model\.dtype: expected float32 or bfloat16"):
        load_config(None, ["model.dtype=fp16"])
    if not torch.cuda.is_available():  # auto resolves to the CPU here: refused when the run starts
        from tepo.training.setup import run_device

        with pytest.raises(ConfigError, match=r"model\.dtype=bfloat16"):
            run_device(load_config(None, ["model.dtype=bfloat16"]))


# ---- checkpoints ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="this machine has CUDA: its checkpoints record CUDA's RNG"
)
def test_a_cpu_machine_checkpoints_no_cuda_rng_and_ignores_a_recorded_one():
    from tepo.checkpoint import rng_state, set_rng_state

    state = rng_state()
    assert "cuda" not in state  # a CPU machine's checkpoint is what it always was
    expected = torch.rand(3)
    set_rng_state({**state, "cuda": [torch.zeros(16, dtype=torch.uint8)]})  # written on a GPU machine
    assert torch.equal(torch.rand(3), expected)


# ---- the rest of a run on the device: vLLM's share of the GPU, tepo compare -----------------------------------


def test_vllm_gpu_share_is_checked_with_the_config():
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.gpu_memory_utilization: must be in \(0, 1\)"):
        load_config(None, ["rollout.vllm.gpu_memory_utilization=1.5"])


def test_the_vllm_server_gets_the_trainers_physical_gpu(monkeypatch):
    from tepo.device import visible_device_for_child

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # this process sees GPUs 2 and 3 as cuda:0 and cuda:1
    assert visible_device_for_child(torch.device("cuda:1")) == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert visible_device_for_child(torch.device("cuda:1")) == "1"


def test_tepo_compare_passes_the_device_to_every_run(monkeypatch, tmp_path):
    import tepo.compare.planning
    from tepo.cli import main

    seen = {}

    def plan(directory, methods, seeds, *, config=None, overrides=(), eval_seed=None):
        seen["overrides"] = list(overrides)
        raise ConfigError("planned")  # stop here: the plan's overrides are what every run is built from

    monkeypatch.setattr(tepo.compare.planning, "plan_comparison", plan)
    argv = ["compare", "--losses", "grpo,tepo", "--dir", str(tmp_path), "train.steps=2"]
    assert main([*argv, "--device", "cpu"]) == 2
    assert seen["overrides"] == ["train.steps=2", "train.device=cpu"]
    assert main(argv) == 2
    assert seen["overrides"] == ["train.steps=2"]  # no --device: each run's train.device (auto by default)
