"""Publishing a finished temporary file under its final name."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["publish"]


def publish(tmp, path) -> Path:
    """Give ``tmp`` the mode an ordinary new file would get (0666 less the umask: mkstemp makes
    it 0600, which a shared data or results folder must not inherit), then rename it over
    ``path`` (atomic within one filesystem)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
    return Path(path)
