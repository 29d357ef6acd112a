"""The vLLM server process and its pipe: JSON-lines requests in, one reply line each out.

:class:`ServerPipe` starts ``vllm_server.py`` in a process group of its own with two pipes, sends a request and
waits for its reply (with a deadline, noticing a server that died), turns a failed reply or a dead server into a
:class:`tepo.rollout.vllm_launch.VLLMServerError` with the end of the server's log, and stops the process group
and removes the weights folder at :meth:`ServerPipe.close`, at garbage collection or at interpreter exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import time
import weakref
from pathlib import Path

from tepo.rollout.base import last_error_line
from tepo.rollout.vllm_launch import SERVER_SCRIPT, VLLMServerError
from tepo.rollout.weight_sync import OWNERS_FILE


class ServerPipe:
    """A running server: ``python vllm_server.py <options>`` in ``weights_dir`` with ``env``, its output in
    ``log_path`` (``temporary_log``: a log to remove with the folder). ``request_timeout_s``: how long a request
    may take."""

    def __init__(
        self,
        python: str,
        options: dict,
        env: dict,
        *,
        weights_dir: Path,
        log_path: Path,
        temporary_log: Path | None,
        request_timeout_s: float,
    ):
        self.log_path = log_path
        self.request_timeout_s = request_timeout_s
        to_server_r, to_server_w = os.pipe()
        from_server_r, from_server_w = os.pipe()
        options = {**options, "--in-fd": to_server_r, "--out-fd": from_server_w}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")  # noqa: SIM115 - the child keeps it; closed below after the fork
        try:
            self.proc = subprocess.Popen(
                [python, str(SERVER_SCRIPT), *(str(x) for item in options.items() for x in item)],
                pass_fds=(to_server_r, from_server_w),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(weights_dir),
                # Its own process group: close() stops vLLM's engine workers with it.
                start_new_session=True,
            )
        finally:
            log_file.close()
            os.close(to_server_r)
            os.close(from_server_w)
        # Who owns the folder, for sweep_orphaned_weight_dirs (a later run removes it if both are killed).
        (weights_dir / OWNERS_FILE).write_text(f"{os.getpid()}\n{self.proc.pid}\n")
        self._requests = os.fdopen(to_server_w, "w", encoding="utf-8")
        self._replies_fd = from_server_r
        self._buffer = b""
        # Runs at close(), at garbage collection, or at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _stop, self.proc, weights_dir, temporary_log)

    def call(self, request: dict) -> dict:
        """Send ``request`` and return the server's reply to it."""
        if self.proc.poll() is not None or self._requests is None:
            raise self.died("the vLLM server is not running")
        try:
            self._requests.write(json.dumps(request) + "\n")
            self._requests.flush()
        except (BrokenPipeError, ValueError) as err:
            raise self.died(f"the vLLM server went away ({err})") from None
        return self.read_reply(self.request_timeout_s, what=request["cmd"])

    def read_reply(self, timeout_s: float, *, what: str) -> dict:
        """The next reply line, within ``timeout_s`` (else the server is stopped); ``what``: for the messages."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise VLLMServerError(
                    f"the vLLM server did not answer {what} within {timeout_s:.0f} s; stopped it"
                )
            ready, _, _ = select.select([self._replies_fd], [], [], min(left, 1.0))
            if not ready:
                if self.proc.poll() is not None:
                    raise self.died(f"the vLLM server exited with code {self.proc.returncode} during {what}")
                continue
            chunk = os.read(self._replies_fd, 1 << 20)
            if not chunk:
                code = self.proc.wait(timeout=30)
                raise self.died(f"the vLLM server exited with code {code} during {what}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(line)
        if not reply.get("ok"):
            error = str(reply.get("error", reply))
            raise VLLMServerError(
                f"the vLLM server failed {what}:\n{error}",
                cause=last_error_line(error),
                log_path=self.log_path,
            )
        return reply

    def died(self, message: str) -> VLLMServerError:
        """The error for a server that is gone: the message with its log's tail, the tail's last error as cause."""
        tail = self._log_tail()
        return VLLMServerError(
            message + tail, cause=last_error_line(tail) if tail else None, log_path=self.log_path
        )

    def _log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return f"; the end of its log ({self.log_path}):\n" + "\n".join(text)

    def close(self) -> None:
        """Ask the server to shut down, close the pipes, then stop the process group and remove the weights
        folder. Safe to call twice."""
        if self.proc.poll() is None and self._requests is not None:
            try:
                self._requests.write(json.dumps({"cmd": "shutdown"}) + "\n")
                self._requests.flush()
                self.proc.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        if self._requests is not None:
            with contextlib.suppress(OSError):
                self._requests.close()
            self._requests = None
        if self._replies_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._replies_fd)
            self._replies_fd = None
        self._finalizer()  # kills the process group if still alive, removes the folder


def _stop(proc: subprocess.Popen, weights_dir: Path, temporary_log: Path | None) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    shutil.rmtree(weights_dir, ignore_errors=True)
    if temporary_log is not None:
        temporary_log.unlink(missing_ok=True)
