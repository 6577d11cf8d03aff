"""Writing files so that an interrupted run never leaves half of one, and plain-text tables.

Every layer that writes (the experiments' result files, ``refbayes trace --save``, ``verify
--json``, ``conformance --json``, the golden traces) writes through these: a temporary file beside
the target, renamed over it once complete (:func:`publish`).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["atomic_write", "atomic_write_npz", "atomic_write_text", "cannot_write", "format_table",
           "publish", "write_json"]


def publish(tmp, path) -> Path:
    """Give ``tmp`` the mode an ordinary new file would get (0666 less the umask: mkstemp makes
    it 0600, which a shared data or results folder must not inherit), then rename it over
    ``path`` (atomic within one filesystem)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
    return Path(path)


def atomic_write(path: Path, write, mode: str = "wb") -> Path:
    """Call ``write(f)`` on a temporary file beside ``path`` opened in ``mode`` ("wb" or "w"),
    then rename it over ``path``; the temporary file is removed if anything fails. Creates the
    folder when it is missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            write(f)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def cannot_write(flag: str, path, err: OSError) -> ValueError:
    """The error of a failed write, naming the command-line flag and the path asked for: the
    OSError itself names the temporary file beside it, or the folder being made."""
    return ValueError(f"{flag}: cannot write {path}: {err.strerror or err}")


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    return atomic_write(path, lambda f: f.write(text), "w")


def atomic_write_npz(path: Path, **arrays) -> Path:
    """Write ``arrays`` as an uncompressed .npz (no pickles), atomically like atomic_write_text."""
    return atomic_write(path, lambda f: np.savez(f, **arrays))


def write_json(path: Path, obj) -> Path:
    """Write ``obj`` as JSON (indent 2, sorted keys, a final newline), atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def format_table(header: list[str], rows: list[list]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])
