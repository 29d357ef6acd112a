"""No route to the Hugging Face hub is said at once (tepo.hub): one probe, then the libraries' offline mode.

The end-to-end tests point ``$HF_ENDPOINT`` at a closed localhost port, so the hub is unreachable here whether or
not the machine has a network, and they leave ``HF_HUB_OFFLINE`` unset: the probe is what must find out. Before
the probe, ``tepo eval --bench gsm8k`` without a data directory retried the hub for 26 s. ``tepo eval``'s message
is tested in test_hub_fallbacks.py (test_unreachable_hub_gives_one_message_naming_the_ways_out), the same way.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from tepo import hub

pytest.importorskip("datasets", reason="the hf-datasets extra is not installed")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _offline_env(tmp_path) -> dict[str, str]:
    """The environment of a process whose hub is a closed port, nothing cached, no offline variable set."""
    env = {k: v for k, v in os.environ.items() if k not in ("TEPO_DATA_DIR", *hub._OFFLINE_VARIABLES)}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{_closed_port()}", HF_HOME=str(tmp_path / "hf-home"))
    return env


@pytest.fixture
def fresh_hub_state(monkeypatch):
    """No verdict yet, no offline variable, libraries online; all restored afterwards."""
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(hub, "_verdict", {})
    for name in hub._OFFLINE_VARIABLES:
        monkeypatch.setenv(name, "")  # empty: unset for tepo and the libraries; restored after the test
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)


def test_probe_tells_an_answer_from_no_answer():
    start = time.perf_counter()
    reason = hub.probe(f"http://127.0.0.1:{_closed_port()}")
    assert reason is not None and "refused" in reason.lower()
    assert time.perf_counter() - start < 1.0

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:  # an error status is an answer: the hub is there
        assert hub.probe(f"http://127.0.0.1:{server.server_address[1]}") is None
    finally:
        server.shutdown()
        server.server_close()


def test_no_answer_puts_the_process_offline_once(fresh_hub_state, monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    calls = []
    monkeypatch.setattr(hub, "probe", lambda endpoint: calls.append(endpoint) or "ConnectionRefused")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert hub.check_hub() == "ConnectionRefused"
    assert calls == ["http://127.0.0.1:9"]
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert hub.check_hub() == "ConnectionRefused" and len(calls) == 1  # remembered, not probed again
    note = hub.offline_note()
    assert "http://127.0.0.1:9" in note and "ConnectionRefused" in note and "HF_HUB_OFFLINE=0" in note


@pytest.mark.parametrize("value", ["1", "0"])
def test_an_explicit_offline_setting_is_honoured_without_a_probe(fresh_hub_state, monkeypatch, value):
    import huggingface_hub.constants

    monkeypatch.setattr(hub, "probe", lambda endpoint: pytest.fail("probed despite HF_HUB_OFFLINE"))
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub.check_hub() is None
    assert (
        not huggingface_hub.constants.HF_HUB_OFFLINE
    )  # unchanged: the libraries read the variable themselves


def test_a_reachable_hub_changes_nothing(fresh_hub_state, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(hub, "probe", lambda endpoint: None)
    assert hub.check_hub() is None and hub.offline_note() == ""
    assert not huggingface_hub.constants.HF_HUB_OFFLINE and os.environ["HF_HUB_OFFLINE"] == ""


# What the loaders do when the hub is a closed port: the seconds from each call to its error (imports excluded).
_LOADERS = r"""
import json, time
import datasets, transformers  # imported first: their import time is not the hub's
from tepo.data import load_problems
from tepo.evaluate.benchmarks import resolve_benchmark
from tepo.models import load_model_and_tokenizer
out = {}
for name, call in [
    ("benchmark", lambda: resolve_benchmark("gsm8k")),
    ("training data", lambda: load_problems("openai/gsm8k", split="test")),
    ("model", lambda: load_model_and_tokenizer("Qwen/Qwen2.5-0.5B")),
]:
    start = time.perf_counter()
    try:
        call()
        out[name] = [None, "loaded"]
    except Exception as err:
        out[name] = [time.perf_counter() - start, f"{type(err).__name__}: {err}"]
print(json.dumps(out))
"""


def test_loaders_say_the_hub_is_unreachable_within_two_seconds(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", _LOADERS],
        cwd=tmp_path,
        env=_offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (seconds, message) in results.items():
        assert seconds is not None and seconds < 2.0, (name, seconds, message)
        assert "did not answer a probe" in message and "HF_HUB_OFFLINE=0" in message, (name, message)
    assert results["benchmark"][1].startswith("DataError") and "--data-dir" in results["benchmark"][1]
    assert results["training data"][1].startswith("DataError")
    assert results["model"][1].startswith("ModelNotFoundError")
    assert "Retrying" not in done.stderr


@pytest.mark.slow  # one more CLI start (a few seconds); the loaders' test above covers train's data loader
def test_tepo_train_with_a_hub_dataset_fails_at_once_in_one_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tepo.cli",
            "train",
            "--data",
            "openai/gsm8k",
            "--output-dir",
            str(tmp_path / "runs"),
        ],
        cwd=tmp_path,
        env=_offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("tepo: error: 'openai/gsm8k' is not a file")
    assert "did not answer a probe" in done.stderr and "Traceback" not in done.stderr
    assert "Retrying" not in done.stderr
