"""Writing a file so that a kill never leaves half of it: the one atomic-write helper of the package.

The guarantee: after :func:`atomic_write_text` (or :func:`atomic_write_with`) returns, ``path`` holds the new
content on disk, and at any moment before it held the old content (or nothing, for a new file), never a torn mix.
How: the content goes to a temporary file in the same folder (``os.replace`` is atomic only within one file
system), which is flushed and ``fsync``-ed, then renamed over ``path``, and the folder is ``fsync``-ed so the
rename itself survives a power loss. A failed write removes its temporary file and leaves ``path`` untouched.

Used for every file a resumed run or a reader must find whole: ``config.yaml``, ``summary.json``,
``eval_before.json``, ``precision.json``, the rewritten ``metrics.jsonl`` of a resume, ``results.json`` of
``tepo eval``, a comparison's ``table.md`` / ``table.json``, the token view's ``samples/step_XXXXXX.json``, and
(without the fsyncs, ``durable=False``) the vLLM engine's weight-sync file. (Append-only logs, such as ``metrics.jsonl`` rows and
``samples.jsonl``, are written by appending and fsync-ing each line instead: a torn last line is skipped by their
readers.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def fsync_folder(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` durable (a no-op where folders cannot be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def atomic_write_with(path: Path, write: Callable[[Path], None], *, durable: bool = True) -> None:
    """Replace ``path`` with what ``write(tmp_path)`` writes to a temporary path beside it (for writers that take
    a path, such as ``safetensors.torch.save_file``); fsync of the file and the folder as in the module docstring.

    ``durable=False`` skips both fsyncs and keeps only the all-or-nothing rename: for a file that is rewritten
    often and never read after a crash (the vLLM weight-sync file, ``tepo.rollout.weight_sync``), where a reader
    must never see half a file but an fsync of 0.3-3 GB per step would buy nothing."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_folder(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically and durably (see the module docstring)."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)

    atomic_write_with(path, write)
