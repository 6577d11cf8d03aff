"""Result files for experiments (atomic writes, so an interrupted run never leaves half a file),
and the argument types their command lines share."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from refbayes._files import publish

__all__ = ["atomic_write_text", "format_table", "positive_int", "read_json", "seed_arg", "write_json"]


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: Path):
    """The JSON object in ``path``, or None when it does not exist (a run not yet done)."""
    path = Path(path)
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def format_table(header: list[str], rows: list[list]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (epochs, restarts)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def seed_arg(text: str) -> int:
    """argparse type: a master seed, an integer >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)
