"""Whether the Hugging Face hub can be reached, asked once per process, and offline mode when it cannot.

Without this, a machine with no route to the hub waits through ``huggingface_hub``'s retries (``http_backoff``:
5 retries, 1 + 2 + 4 + 8 + 8 s apart) before a dataset or model name fails: ``tepo eval --bench gsm8k`` without a
data directory took 26 s to say the hub was unreachable. So before tepo first asks the hub for anything
(a benchmark or training set by dataset name, a model by hub name), :func:`check_hub` sends one request to the
hub's address (``$HF_ENDPOINT``, default https://huggingface.co) and waits at most :data:`PROBE_TIMEOUT_S`:

- any HTTP answer (even an error status) means the hub is reachable: nothing changes;
- no answer (no route, refused, name not resolved, timeout) switches this process to the libraries' offline mode
  (``HF_HUB_OFFLINE``), so whatever is in the Hugging Face cache still loads and anything else fails at once with
  the library's own "offline" error, to which the caller adds :func:`offline_note`.

An explicit ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE`` / ``HF_DATASETS_OFFLINE``) is honoured and no probe is
sent: set to true, the process is offline already; set to false (``HF_HUB_OFFLINE=0``), the user asks for the hub
whatever a probe would say, and the libraries retry as they do. The probe runs in a thread so that even a name
lookup that hangs cannot hold the caller longer than the timeout.
"""

from __future__ import annotations

import os
import sys
import threading
import urllib.error
import urllib.request

OFFLINE_ENV = "HF_HUB_OFFLINE"
# Every variable by which the Hugging Face libraries are put offline (or explicitly online).
_OFFLINE_VARIABLES = (OFFLINE_ENV, "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
DEFAULT_ENDPOINT = "https://huggingface.co"
# Long enough for a round trip to the hub from anywhere, short enough that an offline error comes in < 2 s.
PROBE_TIMEOUT_S = 1.5

_lock = threading.Lock()
_verdict: dict[str, str | None] = {}  # endpoint -> None (reachable) or why not; one probe per process


def hub_endpoint() -> str:
    """The hub's address as the Hugging Face libraries use it: ``$HF_ENDPOINT``, else https://huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _explicit_offline_setting() -> str | None:
    """The first offline variable that is set (to anything), or None when the user left them all unset."""
    return next((name for name in _OFFLINE_VARIABLES if os.environ.get(name, "").strip()), None)


def _libraries_offline() -> bool:
    """Whether an already-imported Hugging Face library was put offline in this process (by a caller or a test)."""
    constants = sys.modules.get("huggingface_hub.constants")
    datasets_config = sys.modules.get("datasets.config")
    return bool(getattr(constants, "HF_HUB_OFFLINE", False)) or bool(
        getattr(datasets_config, "HF_HUB_OFFLINE", False)
    )


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None if ``endpoint`` gave any HTTP answer within ``timeout`` seconds, else the reason it did not.

    A HEAD request through urllib (which honours ``$HTTPS_PROXY`` / ``$NO_PROXY`` as the hub clients do), in a
    daemon thread joined with the timeout: a name lookup ignores socket timeouts and can hang for long.
    """
    outcome: list[str | None] = []

    def ask() -> None:
        request = urllib.request.Request(endpoint + "/", method="HEAD")
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                outcome.append(None)
        except urllib.error.HTTPError:  # an answer, even a 4xx/5xx one: the hub is there
            outcome.append(None)
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            outcome.append(f"{type(err).__name__}: {reason}")

    thread = threading.Thread(target=ask, name="tepo-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.25)
    if not outcome:
        return f"no answer within {timeout:g} s"
    return outcome[0]


def go_offline() -> None:
    """Put this process's Hugging Face libraries offline, including those already imported (they read the
    variable once, at import): cached datasets and models still load; nothing is requested from the hub."""
    os.environ[OFFLINE_ENV] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True
        datasets_config.HF_DATASETS_OFFLINE = True


def check_hub() -> str | None:
    """Probe the hub once per process before the first request to it; None when tepo may ask it as usual.

    When the probe gets no answer the process goes offline (:func:`go_offline`) and the reason is returned (and
    remembered: later calls return it without a new probe). With an explicit offline setting, or libraries put
    offline already, nothing is probed and None is returned.
    """
    endpoint = hub_endpoint()
    with _lock:
        if endpoint in _verdict:  # asked already (its own offline switch must not hide the reason)
            return _verdict[endpoint]
        if _explicit_offline_setting() is not None or _libraries_offline():
            return None
        _verdict[endpoint] = probe(endpoint)
        if _verdict[endpoint] is not None:
            go_offline()
        return _verdict[endpoint]


def offline_note(reason: str | None = None) -> str:
    """What a message about a failed hub load adds: why tepo is offline, and how to choose otherwise."""
    if reason is None:
        reason = _verdict.get(hub_endpoint())
    if reason is None:
        return ""
    return (
        f"the Hugging Face hub ({hub_endpoint()}) did not answer a probe ({reason}), so tepo works offline "
        f"(only what is in the Hugging Face cache loads; set {OFFLINE_ENV}=0 to skip the probe)"
    )
