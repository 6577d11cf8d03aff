"""Where the benchmark data lives: the data-directory resolution order and missing-file errors.

The data directory is the first of
  1. the explicit ``data_dir`` argument (``--data-dir`` on the command line),
  2. the environment variable ``REFBAYES_DATA``,
  3. the user cache, ``$XDG_CACHE_HOME/refbayes/data`` (``~/.cache/refbayes/data`` when
     ``XDG_CACHE_HOME`` is unset or not absolute, as the XDG base-directory spec says).
Only the first one that is set is used; files are never mixed from several places, so a result
always comes from one identifiable copy of the data. Under it the layout is the staged one, e.g.
``a1a/a1a``, ``usps/usps_all.mat``, ``uci_regression/yacht/data/data.txt``.
"""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV_VAR", "resolve_data_dir", "user_cache_dir", "require_file"]

ENV_VAR = "REFBAYES_DATA"


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/refbayes/data``, or ``~/.cache/refbayes/data``."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "refbayes" / "data"


def resolve_data_dir(data_dir=None) -> Path:
    """The data directory: ``data_dir`` if given, else ``$REFBAYES_DATA``, else the user cache.

    The directory need not exist yet (``refbayes data fetch`` creates it).
    """
    if data_dir is not None:
        if not isinstance(data_dir, (str, os.PathLike)) or not str(data_dir):
            raise ValueError(f"data_dir: expected a non-empty path, got {data_dir!r}")
        return Path(data_dir).expanduser()
    env = os.environ.get(ENV_VAR, "")
    if env:
        return Path(env).expanduser()
    return user_cache_dir()


def _searched(data_dir) -> str:
    env = os.environ.get(ENV_VAR, "")
    chosen = 1 if data_dir is not None else (2 if env else 3)
    places = [
        f"data_dir argument / --data-dir: {str(data_dir) if data_dir is not None else 'not given'}",
        f"environment variable {ENV_VAR}: {env if env else 'not set'}",
        f"user cache: {user_cache_dir()}",
    ]
    return "\n".join(f"  {i}. {p}{'   <- used' if i == chosen else ''}"
                     for i, p in enumerate(places, start=1))


def require_file(dataset: str, relpath: str, data_dir=None, alternatives=()) -> Path:
    """The path of ``relpath`` under the resolved data directory; FileNotFoundError if absent.

    The error names the dataset, the path looked at (and the ``alternatives``, other accepted
    names of the same file, which the caller found absent too), the three places in resolution
    order (and which one was used), and the two ways to fix it.
    """
    path = resolve_data_dir(data_dir) / relpath
    if path.is_file():
        return path
    nor = "".join(f" (nor {alt})" for alt in alternatives)
    raise FileNotFoundError(
        f"dataset {dataset!r}: file not found: {path}{nor}\n"
        f"The data directory is the first of these that is set:\n{_searched(data_dir)}\n"
        f"Fix: run `refbayes data fetch {dataset}` (downloads into the directory used above), "
        f"or set {ENV_VAR} (or pass --data-dir) to a folder holding {relpath}.")
