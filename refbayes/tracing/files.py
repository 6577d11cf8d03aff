"""The golden trace file: ``Trace`` in memory, ``save`` / ``load`` of its npz and JSON manifest.

The format is specified in ``derivations/tracing.md`` ("The trace file").
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from refbayes import __version__
from refbayes._files import atomic_write_npz, atomic_write_text

__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_KEY", "Trace", "load", "read_manifest", "read_npz",
           "save"]

FORMAT = "refbayes-golden-trace"
# 2: the one naming rule (input.batch.*, input.cfg.<field> for every numeric config field,
# input.eps.*), a scale per quantity, condition numbers for every trace, chained noisy-kfac
FORMAT_VERSION = 2
MANIFEST_KEY = "__manifest__"


class Trace(NamedTuple):
    """A golden trace in memory.

    Attributes
    ----------
    method : str
        The traced method, a key of ``TRACERS``.
    options : dict
        The build options: seed, steps, dtype and the method's own options.
    inputs : dict of str to numpy.ndarray
        Every input by name (``input.*``).
    outputs : dict of str to numpy.ndarray
        Every named intermediate, leading step axis K, in comparison order.
    tags : dict of str to str
        Equation tag of each output (and of ``input.state.*``), '' when the field has none.
    param_axes : dict of str to tuple of int
        The axes of each array that run over the D parameters (for layout conversion).
    condition : dict of str to float or None
        Measured condition number of each output, None where not measured.
    config : dict
        The config's scalar fields (JSON values).
    model : dict
        The model spec (``model_from_spec`` rebuilds it).
    per_step : list of str
        The inputs with a leading step axis (minibatches, draws).
    manifest : dict
        The full manifest (format, versions, command, arrays), as saved.
    """
    method: str
    options: dict
    inputs: dict
    outputs: dict
    tags: dict
    param_axes: dict
    condition: dict
    config: dict
    model: dict
    per_step: list
    manifest: dict


def save(trace: Trace, path) -> Path:
    """Write a trace as ``path`` (npz, the manifest inside) and ``path + '.json'``.

    Parameters
    ----------
    trace : Trace
        From ``build``.
    path : str or pathlib.Path
        The npz file; its folder must exist.

    Returns
    -------
    pathlib.Path
        The npz path written.

    Raises
    ------
    ValueError
        If the path does not end in '.npz'.
    FileNotFoundError
        If its folder does not exist.
    """
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"path: expected a file name ending in .npz, got {str(path)!r}")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"path: the folder {path.parent} does not exist")
    text = json.dumps(trace.manifest, indent=1, sort_keys=False)
    arrays = {**trace.inputs, **trace.outputs, MANIFEST_KEY: np.array(text)}
    atomic_write_npz(path, **arrays)
    atomic_write_text(path.with_name(path.name + ".json"), text + "\n")
    return path


def read_npz(path, name: str) -> dict:
    """Read every array of an npz file, refusing pickled entries.

    Parameters
    ----------
    path : str or pathlib.Path
        The file.
    name : str
        The argument's name, for the messages.

    Returns
    -------
    dict of str to numpy.ndarray
        The arrays by name.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not an npz file, or an entry needs pickle (an object array).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no file {path}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as err:
        raise ValueError(f"{name}: {path} is not a readable npz file of numeric arrays "
                         f"({err})") from None


def read_manifest(path) -> dict:
    """Read the manifest of a golden trace of any format version.

    ``bless`` rebuilds an older trace from it; ``load`` refuses one.

    Parameters
    ----------
    path : str or pathlib.Path
        The npz file.

    Returns
    -------
    dict
        The manifest.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not an npz file or has no manifest.
    """
    arrays = read_npz(path, "trace")
    if MANIFEST_KEY not in arrays:
        raise ValueError(f"trace: {path} has no {MANIFEST_KEY} entry; it is not a golden trace "
                         "(make one with `refbayes trace METHOD --save FILE`)")
    return json.loads(str(arrays[MANIFEST_KEY]))


def load(path) -> Trace:
    """Read a golden trace written by ``save``.

    Parameters
    ----------
    path : str or pathlib.Path
        The npz file.

    Returns
    -------
    Trace
        The trace.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not a golden trace (no manifest, another format, a format version this refbayes
        cannot read) or its arrays disagree with the manifest.
    """
    path = Path(path)
    arrays = read_npz(path, "trace")
    if MANIFEST_KEY not in arrays:
        raise ValueError(f"trace: {path} has no {MANIFEST_KEY} entry; it is not a golden trace "
                         "(make one with `refbayes trace METHOD --save FILE`)")
    manifest = json.loads(str(arrays.pop(MANIFEST_KEY)))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"trace: {path} has format {manifest.get('format')!r}, expected "
                         f"{FORMAT!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"trace: {path} has format version {manifest.get('format_version')}, this "
                         f"refbayes (version {__version__}) reads version {FORMAT_VERSION} only "
                         f"(the names and the manifest changed); re-run `refbayes trace` to "
                         f"rebuild it: {manifest.get('command', 'refbayes trace METHOD')}")
    inputs, outputs = {}, {}
    for group, target in (("inputs", inputs), ("outputs", outputs)):
        for name, meta in manifest[group].items():
            if name not in arrays:
                raise ValueError(f"trace: {path} lacks the array {name!r} of its manifest")
            if list(arrays[name].shape) != meta["shape"]:
                raise ValueError(f"trace: {path}: {name} has shape {arrays[name].shape}, its "
                                 f"manifest says {tuple(meta['shape'])}")
            target[name] = arrays[name]
    outputs = {n: outputs[n] for n in manifest["order"]}
    tags = {n: m["tag"] for g in ("inputs", "outputs") for n, m in manifest[g].items()}
    axes = {n: tuple(m["param_axes"]) for g in ("inputs", "outputs")
            for n, m in manifest[g].items()}
    condition = {n: m["condition"] for n, m in manifest["outputs"].items()}
    per_step = sorted(n for n, m in manifest["inputs"].items() if m["per_step"])
    return Trace(manifest["method"], manifest["options"], inputs, outputs, tags, axes, condition,
                 manifest["config"], manifest["model"], per_step, manifest)
