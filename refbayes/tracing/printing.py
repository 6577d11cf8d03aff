"""The one printed form and the one JSON form of a trace, for every method: the golden trace
(``Trace``), its inputs in full, then each step's outputs under their equation tags.
"""
from __future__ import annotations

import numpy as np

from refbayes.tracing.files import Trace

__all__ = ["SHOW_ALL", "SHOW_FIRST", "format_trace", "format_values", "to_json"]

SHOW_ALL = 200      # arrays up to this many entries are printed in full
SHOW_FIRST = 10     # entries shown of a larger array, with its norm


def _format_float(precision):
    return lambda v: f"{v: .{precision}e}"  # sign column keeps entries aligned


def format_values(a, precision: int, full: bool = False) -> str:
    """Format the values of a scalar or array as printed in a trace block.

    Every entry when ``full`` or up to SHOW_ALL of them, else the first SHOW_FIRST (C order) and
    the Frobenius norm.

    Parameters
    ----------
    a : array_like
        A scalar or an array.
    precision : int
        Digits after the point (e-format); 16 round-trips float64.
    full : bool, default False
        Print every entry whatever the size.

    Returns
    -------
    str
        The text, possibly over several lines.
    """
    a = np.asarray(a)
    fmt = {"float_kind": _format_float(precision)}
    if a.ndim == 0:
        return fmt["float_kind"](float(a)) if a.dtype.kind == "f" else str(a)
    if full or a.size <= SHOW_ALL:
        return np.array2string(a, separator=", ", formatter=fmt, threshold=a.size + 1,
                               max_line_width=100)
    first = np.array2string(a.reshape(-1)[:SHOW_FIRST], separator=", ", formatter=fmt,
                            max_line_width=100)
    return (f"first {SHOW_FIRST} of {a.size} entries (C order): {first}\n"
            f"norm: {_format_float(precision)(float(np.linalg.norm(a.reshape(-1))))}")


def _shape(a) -> str:
    return str(tuple(np.shape(a)))


def _block(label: str, name: str, value, precision: int, full: bool = False) -> str:
    body = "\n".join("  " + line for line in format_values(value, precision, full).splitlines())
    return f"[{label}] {name} {_shape(value)}\n{body}"


def format_trace(trace: Trace, precision: int = 8) -> str:
    """Format a golden trace as printed: header, inputs, scales, then each step's outputs.

    Parameters
    ----------
    trace : Trace
        From ``build`` or ``load``.
    precision : int, default 8
        Digits after the point; 16 round-trips float64.

    Returns
    -------
    str
        The trace, ending with a newline.
    """
    man = trace.manifest
    K = next(iter(trace.outputs.values())).shape[0]
    lines = [f"refbayes trace {trace.method}: {K} step(s), {man['options']['dtype']}; "
             f"equations in {man['derivation']}",
             f"command: {man['command']}",
             f"model: {man['model']['repr']}, D = {man['model']['D']}",
             "config: " + ", ".join(f"{k}={v!r}" for k, v in trace.config.items()),
             "draws: step 1 after the start from numpy.random.default_rng(seed)"
             + ("; step k + 1 >= 2 from numpy.random.default_rng([seed, k])" if K > 1 else "")
             + "; the problem, the start and the order of the draws: derivations/tracing.md"]
    if man.get("note"):
        lines.append(f"order: {man['note']}")
    lines.append(f"condition: {man.get('condition_rule') or 'not measured'}")
    lines.append("")
    for name, value in trace.inputs.items():
        lines += [_block("input", name, value, precision, full=True), ""]
    lines.append("scales (which sum over data each output is):")
    lines += [f"  {name}: {meta.get('scale')}" for name, meta in man["outputs"].items()] + [""]
    for k in range(K):
        lines.append(f"step {k + 1}:")
        for name, value in trace.outputs.items():
            label = trace.tags.get(name) or "untagged"
            lines += [_block(label, name, value[k], precision), ""]
    return "\n".join(lines).rstrip() + "\n"


def to_json(trace: Trace) -> dict:
    """The trace as JSON-ready data: its manifest, and every input and output as nested lists.

    Python floats are written by ``json`` with repr, so they round-trip exactly; the manifest
    gives each array's shape, dtype, tag and parameter axes (``derivations/tracing.md``): read an
    array back with ``numpy.array(values, dtype).reshape(shape)``, as an empty array's nested
    list does not keep its shape.

    Parameters
    ----------
    trace : Trace
        From ``build`` or ``load``.

    Returns
    -------
    dict
        Keys manifest, inputs and outputs (outputs in comparison order, each with its leading
        step axis).
    """
    return {"manifest": trace.manifest,
            "inputs": {n: a.tolist() for n, a in trace.inputs.items()},
            "outputs": {n: a.tolist() for n, a in trace.outputs.items()}}
