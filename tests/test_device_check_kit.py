"""The device check runs where it is meant to: a machine with only torch and transformers, no network
(issue #35, item 8). Proven once by hand in a fresh venv (docs/performance.md, "Device check in a clean venv");
these tests pin the three pieces that made it fail there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from helpers import load_script, tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_train_command_without_matplotlib_skips_the_plot(tmp_path, monkeypatch, capsys):
    import importlib.util

    import tepo.cli
    import tepo.report
    import tepo.training

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("")
    result = SimpleNamespace(run_dir=run_dir, summary={}, steps_done=0)
    monkeypatch.setattr(tepo.training, "train", lambda config: result)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a),
    )

    def no_plot(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr(tepo.report, "plot_training_curves", no_plot)
    args = SimpleNamespace(
        resume=None,
        overrides=[],
        trust_remote_code=False,
        model=None,
        data=None,
        output_dir=None,
        config=None,
    )
    assert tepo.cli._cmd_train(args) == 0
    assert "matplotlib is not installed" in capsys.readouterr().out


def test_prepared_wheels_import_with_nothing_installed(tmp_path):
    """--prepare builds the carried wheels from this environment; a Python without site-packages (-S) imports
    math_verify and pytest from them as zips, which is all gpu_check.sh does with them."""
    gpu_check = load_script("gpu_check")
    made = gpu_check.prepare_wheels(tmp_path)
    assert len(made) == len(gpu_check.CARRIED)
    wheels = sorted(str(p) for p in tmp_path.glob("*.whl"))
    stdlib_only = [p for p in sys.path if "site-packages" not in p and p]
    code = (
        "import sys, json; sys.path[:0] = json.loads(sys.argv[1]);"
        "import math_verify, pytest, latex2sympy2_extended, antlr4, pluggy, iniconfig, pygments;"
        "print(math_verify.__file__)"
    )
    env = {"PYTHONPATH": ":".join(stdlib_only), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code, json.dumps(wheels)], capture_output=True, text=True, env=env
    )
    # sympy (latex2sympy2_extended's dependency) comes with torch on the device machine, not from the kit
    if "No module named 'sympy'" in out.stderr or "No module named 'mpmath'" in out.stderr:
        site = [p for p in sys.path if p.endswith("site-packages")]
        env["PYTHONPATH"] = ":".join(stdlib_only)
        out = subprocess.run(
            [sys.executable, "-S", "-c", code, json.dumps(wheels + site)],
            capture_output=True,
            text=True,
            env=env,
        )
    assert out.returncode == 0, out.stderr[-2000:]
    assert ".whl" in out.stdout  # imported from the wheel, not from an installed copy


def test_shared_prompt_falls_back_where_transformers_lacks_the_cache_flag(monkeypatch):
    """transformers 5.17 (the device machine's) may not know ``_can_checkpoint_with_cache``: with checkpointing on,
    the shared-prompt pass is not used there (the plain pass gives the same values)."""
    import tepo.logprobs
    from tepo.logprobs import response_logprobs
    from tepo.prompt_cache import checkpointed_cache_allowed

    class Old(torch.nn.Module):  # a checkpointing layer of a transformers without the flag
        gradient_checkpointing = True

    class New(Old):
        _can_checkpoint_with_cache = False

    old_body, new_body = SimpleNamespace(layers=[Old().train()]), SimpleNamespace(layers=[New().train()])
    assert checkpointed_cache_allowed(new_body)
    assert not checkpointed_cache_allowed(old_body)
    with torch.no_grad():
        assert checkpointed_cache_allowed(old_body)  # no backward, no checkpointing: the cache is kept
    assert checkpointed_cache_allowed(SimpleNamespace(layers=[Old().eval()]))

    model = tiny_llama(0).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert checkpointed_cache_allowed(model.model)  # this transformers (5.25) has the flag
    ids = torch.randint(1, 97, (4, 10), generator=torch.Generator().manual_seed(0))
    ids[1:, :5] = ids[0, :5]
    groups = torch.zeros(4, dtype=torch.long)
    shared_calls = []
    real = tepo.logprobs.shared_prompt_hidden
    monkeypatch.setattr(tepo.logprobs, "shared_prompt_hidden", lambda *a: shared_calls.append(1) or real(*a))
    with_flag, _, _ = response_logprobs(model, ids, torch.ones_like(ids), 5, prompt_groups=groups)
    assert shared_calls == [1]
    monkeypatch.setattr(tepo.logprobs, "checkpointed_cache_allowed", lambda body: False)
    without_flag, _, _ = response_logprobs(model, ids, torch.ones_like(ids), 5, prompt_groups=groups)
    assert shared_calls == [1]  # not called again: the plain pass
    torch.testing.assert_close(without_flag, with_flag, atol=1e-5, rtol=0)
