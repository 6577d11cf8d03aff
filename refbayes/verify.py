"""``refbayes verify``: compare another implementation's dump with a golden trace.

The user runs their implementation on the trace's inputs (``refbayes.tracing.load(TRACE).inputs``:
the starting state, minibatches and draws), saves the quantities they compute under the trace's
names (any subset, ``numpy.savez``), and calls ``compare`` (or ``refbayes verify TRACE
YOURS.npz``). Every quantity is compared step by step in the order the method computes it, and the
first one that diverges is reported with its equation tag and derivation note: the equations
before it are right, the one it names is where to look.

Shapes. A dumped array has the trace's shape (K, ...) for K steps, or (k, ...) for the first
k <= K steps, or the per-step shape (...) for step 1 alone. Inputs (``input.*``) may be dumped too,
to check that the right inputs were fed; the inputs a user computes (``input.probs`` and
``input.y_tilde`` of a noisy-kfac trace with curvature mc: the predictive at the draws w and the
labels sampled from it) are compared like outputs, right after w. A golden trace's
``__manifest__`` entry is no quantity and is dropped from a dump: a trace verifies against itself.

Errors. For a quantity with reference b and dump a (both as float64), the error is
``max|a - b| / max|b|`` (``max|b|`` taken as 1 when b is all zero, so the test is absolute), and the
worst entry is the argmax of ``|a - b|``. Integer and boolean quantities must be equal.

Tolerance rule. With d the less precise of the trace's and the dump's float types, u(d) its unit
roundoff (2^-53 for float64, 2^-24 for float32) and kappa the quantity's condition number measured
when the trace was built (``refbayes.tracing``: the float32 run's error relative to the float64 run,
in units of u32)::

    tol = max(exact(d), SAFETY * kappa * u(d))

with exact(d) the exact-identity tolerance of ``refbayes._tolerances`` (1e-10 for float64, 1e-3 for
float32) and SAFETY = 10, since a measured error is one sample of rounding, and another
implementation's order of operations rounds differently. Every float quantity of a trace of
format version 2 carries kappa (the float64-only Laplace methods measure it on inputs rounded to
float32: the manifest's ``condition_rule``); where kappa is null (an integer, or a quantity
compared by its absolute error), tol = exact(d). ``rtol`` overrides the rule, and the report's
notes say by how much (the range of the rule's tolerances it replaced, and the factor); it must
be below 1: at rtol >= 1 a dump of zeros passes every float quantity (its error is exactly 1).

Layouts. ``layout="torch"`` (or "flax") reads every parameter axis of the dump (an axis of length
D, recorded in the manifest) in that framework's order and converts it to refbayes' flat theta
(``refbayes.layout``), and each D-block of BBB's [mu; rho] quantities (``delta``,
``state.adam.m``, ``state.adam.v``: length 2 D). k-tied's rho, of its own length P, has no
recorded framework layout: its quantities (rho, grad_rho and the [mu; rho] ones of length D + P)
are compared in refbayes order, and the report says so. A diverging quantity that matches the
trace up to a layout's permutation of its parameter axes is named a layout mistake: on the
output side (the dump is still in that layout: rerun with ``--layout``) or on the input side (it
holds the trace's values read in that layout, as a framework's model fed the inputs in refbayes
order computes them). SLANG's new U is compared up to the sign of each column, which no
eigensolver fixes the same way. A quantity that vanishes in exact arithmetic (the gradient g at
the MAP of the Riemannian Laplace trace, zero up to the MAP's stopping rule) is compared by its
absolute error against the bound the manifest records (``absolute``).
"""
from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from refbayes import __version__, tracing
from refbayes import layout as layouts
from refbayes._files import atomic_write_text, cannot_write, format_table
from refbayes._tolerances import exact
from refbayes.tracing.files import MANIFEST_KEY

__all__ = ["SAFETY", "Row", "Report", "tolerance", "load_dump", "compare", "assert_matches",
           "add_arguments", "run"]

SAFETY = 10.0

# The Adam state (and its step delta) of the methods that train [mu; rho] by Adam (bbb, ktied):
# two D-blocks for BBB (rho over theta), D + P for k-tied (rho its tied factors, ktied.layout).
_MU_RHO = ("delta", "state.adam.m", "state.adam.v", "input.state.adam.m", "input.state.adam.v")
# k-tied's rho (P,): no framework layout of it is recorded in the trace.
_RHO = ("rho", "grad_rho", "input.state.rho")
# Inputs the user computes (noisy-kfac with curvature mc): name -> (the quantity after which
# they are compared, their tag); the recipe is in derivations/tracing.md.
_COMPUTED_INPUTS = {"input.probs": ("w", "(noisy_kfac.3)"),
                    "input.y_tilde": ("input.probs", "(noisy_kfac.3)")}
_OUTPUT_SIDE, _INPUT_SIDE = "matches in the ", "values match the trace in "


class Row(NamedTuple):
    """One quantity at one step.

    Attributes
    ----------
    name : str
        The quantity's name in the trace.
    step : int
        The step, 1-based (1 for inputs without a step axis).
    tag : str
        Its equation tag ('' when untagged, 'input' for inputs).
    derivation : str
        The derivation note of the tag.
    status : str
        'ok', 'diverges', 'shape', 'non-finite' or 'dtype'.
    max_abs : float
        Max absolute error (nan when not compared).
    max_rel : float
        Max error relative to the reference's scale (nan when not compared).
    tol : float
        The tolerance applied.
    worst : tuple of int
        Index (within the step) of the worst entry, in the dump's layout, () for scalars or
        when not compared.
    yours : float
        Your value there (nan when not compared).
    reference : float
        The trace's value there (nan when not compared).
    detail : str
        A hint (wrong shape, NaN position, a layout mistake: another layout that matches), '' when
        ok.
    """
    name: str
    step: int
    tag: str
    derivation: str
    status: str
    max_abs: float
    max_rel: float
    tol: float
    worst: tuple
    yours: float
    reference: float
    detail: str

    @property
    def ok(self) -> bool:
        """Whether the quantity agrees."""
        return self.status == "ok"


class Report(NamedTuple):
    """The comparison of a dump with a golden trace.

    Attributes
    ----------
    method : str
        The traced method.
    rows : list of Row
        Every comparison, inputs first, then step by step in the method's order.
    not_dumped : list of str
        The trace's quantities absent from the dump.
    ignored : list of str
        The dump's names that are not in the trace (not compared).
    notes : list of str
        Remarks (another refbayes version, the layout used, the quantities compared in refbayes
        order despite it, how far rtol moved the tolerances).
    """
    method: str
    rows: list
    not_dumped: list
    ignored: list
    notes: list

    @property
    def ok(self) -> bool:
        """Whether every compared quantity agrees."""
        return all(r.ok for r in self.rows)

    @property
    def first_failure(self) -> Row | None:
        """The first quantity (in the method's order) that does not agree, or None."""
        return next((r for r in self.rows if not r.ok), None)

    def __str__(self) -> str:
        return format_report(self)


def tolerance(dtype, condition: float | None) -> float:
    """Give the tolerance of a quantity: max(exact(d), SAFETY kappa u(d)), see the module docstring.

    Parameters
    ----------
    dtype : numpy dtype
        The less precise float type of the two sides (float64 or float32).
    condition : float or None
        The measured condition number kappa >= 1, or None (not measured).

    Returns
    -------
    float
        The relative tolerance.
    """
    d = np.dtype(dtype)
    base = exact(d)
    if condition is None:
        return base
    return max(base, SAFETY * float(condition) * float(np.finfo(d).eps) / 2)  # u = eps / 2


def load_dump(yours) -> dict:
    """Read a dump: an npz file (no pickle) or a mapping of names to arrays.

    Parameters
    ----------
    yours : str, pathlib.Path or mapping
        The npz path, or e.g. ``{"g_hat": tensor.numpy()}``.

    Returns
    -------
    dict of str to numpy.ndarray
        The arrays.

    The entry ``__manifest__`` of a golden trace is dropped, so that a trace read as a dump is
    compared with itself (``refbayes verify TRACE TRACE``).

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If it is not an npz of numeric arrays (object arrays need pickle and are refused), or a
        damaged (truncated) one.
    """
    if isinstance(yours, (str, Path)):
        arrays = _read_file(yours, "yours", lambda path: tracing.read_npz(path, "yours"))
    elif hasattr(yours, "items"):
        arrays = {str(k): np.asarray(v) for k, v in yours.items()}
    else:
        raise ValueError(f"yours: expected an npz path or a mapping of names to arrays, got "
                         f"{type(yours).__name__}")
    arrays.pop(MANIFEST_KEY, None)
    for name, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise ValueError(f"yours: {name} has dtype {a.dtype}; expected a numeric array")
    return arrays


def _read_file(path, name: str, read):
    """``read(path)``, with a file that is no zip archive, or a damaged one, refused by a
    ValueError naming the argument ``name`` and the file."""
    path = Path(path)
    if path.is_file():
        with open(path, "rb") as f:
            head = f.read(4)
        if head[:2] != b"PK":  # every zip archive (numpy.savez) starts so
            what = "an empty file" if not head else "no zip archive"
            raise ValueError(f"{name}: {path} is not a readable npz file: it is {what} "
                             f"(damaged, or not written by numpy.savez)")
    try:
        return read(path)
    except (zipfile.BadZipFile, EOFError, zlib.error) as err:
        raise ValueError(f"{name}: {path} is not a readable npz file: a damaged or truncated zip "
                         f"archive ({err})") from None


def _precision(ref: np.ndarray, mine: np.ndarray):
    kinds = [a.dtype for a in (ref, mine) if a.dtype.kind == "f"]
    return np.dtype(np.float32) if any(d.itemsize < 8 for d in kinds) else np.dtype(np.float64)


def _errors(mine: np.ndarray, ref: np.ndarray):
    diff = np.abs(mine.astype(np.float64) - ref.astype(np.float64))
    scale = float(np.max(np.abs(ref), initial=0.0))
    scale = scale if scale > 0 else 1.0
    if diff.size == 0:
        return 0.0, 0.0, ()
    flat = int(np.argmax(diff))
    worst = np.unravel_index(flat, diff.shape) if diff.ndim else ()
    return float(diff.reshape(-1)[flat]), float(diff.reshape(-1)[flat]) / scale, \
        tuple(int(i) for i in worst)


def _align_signs(mine: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Flip each column of mine (..., D, L) to the sign of ref's column (eigenvector signs)."""
    dots = np.sum(mine * ref, axis=-2, keepdims=True)
    return mine * np.where(dots < 0, -1.0, 1.0)


def _compare_one(name, step, mine, ref, tag, derivation, condition, rtol, sign_free,
                 atol=None) -> Row:
    if ref.dtype.kind == "f" and mine.dtype.kind not in "f":
        mine = mine.astype(np.float64)
    if ref.dtype.kind in "biu":
        tol = 0.0
    elif atol is not None:  # a quantity that vanishes in exact arithmetic: an absolute test
        tol = atol
    else:
        tol = rtol if rtol is not None else tolerance(_precision(ref, mine), condition)

    def row(status, max_abs=np.nan, max_rel=np.nan, worst=(), detail=""):
        at = (lambda a: float(a[worst]) if a.size and (worst or a.ndim == 0) else np.nan)
        return Row(name, step, tag, derivation, status, max_abs, max_rel, tol, worst, at(mine),
                   at(ref), detail)

    if ref.dtype.kind in "biu" and mine.dtype.kind == "f" \
            and not np.array_equal(mine, np.round(mine)):
        return row("dtype", detail=f"expected integers ({ref.dtype}), got non-integral floats")
    bad_ref, bad_mine = ~np.isfinite(ref.astype(np.float64)), ~np.isfinite(mine.astype(np.float64))
    if np.any(bad_mine & ~bad_ref):
        where = tuple(int(i) for i in np.argwhere(bad_mine & ~bad_ref)[0])
        return row("non-finite", worst=where,
                   detail=f"{int(np.sum(bad_mine & ~bad_ref))} non-finite entries where the trace "
                          f"is finite, first at index {where}")
    if sign_free and mine.ndim >= 2:
        mine = _align_signs(mine, ref)
    finite = ~bad_ref
    max_abs, max_rel, worst = _errors(np.where(finite, mine, 0.0), np.where(finite, ref, 0.0))
    error = max_abs if atol is not None or ref.dtype.kind in "biu" else max_rel
    ok = error <= tol and np.array_equal(bad_ref, bad_mine)
    if atol is not None:
        detail = "absolute error against tol: the quantity vanishes in exact arithmetic"
    else:
        detail = "compared up to column signs" if sign_free and not ok else ""
    return row("ok" if ok else "diverges", max_abs, max_rel, worst, detail)


def _steps_of(mine: np.ndarray, ref: np.ndarray, per_step: bool):
    """mine as (k, ...) with k <= K, or None for a shape that fits neither form."""
    if not per_step:
        return mine[None] if mine.shape == ref.shape else None
    K = ref.shape[0]
    if mine.shape == ref.shape[1:]:
        return mine[None]
    if mine.ndim == ref.ndim and mine.shape[1:] == ref.shape[1:] and 1 <= mine.shape[0] <= K:
        return mine
    return None


def _layout_axes(trace, name: str, ref: np.ndarray, D: int | None) -> dict:
    """The parameter axes of the trace's full array of ``name``: axis -> its number of D-blocks
    (1 for an axis of length D, recorded in the manifest; 2 for BBB's [mu; rho] quantities, whose
    last axis holds two D-blocks and is recorded as none)."""
    axes = {int(a): 1 for a in trace.param_axes.get(name, ())}
    if not axes and name in _MU_RHO and D and ref.ndim >= 1 and ref.shape[-1] == 2 * D:
        axes = {ref.ndim - 1: 2}
    return axes


def _step_axes(axes: dict, per_step: bool) -> dict:
    """The parameter axes of one step's array (the step axis removed)."""
    return {a - 1: b for a, b in axes.items() if a >= 1} if per_step else dict(axes)


def _block_permutation(model, layout: str, blocks: int) -> np.ndarray:
    """``layout.permutation`` applied to each of ``blocks`` consecutive D-blocks."""
    return layouts.permutation(model, layout, blocks=blocks)


def _reorder(a: np.ndarray, axes: dict, model, layout: str, inverse: bool) -> np.ndarray:
    """a's parameter axes (axis -> D-blocks) put from ``layout`` into refbayes' order
    (``layout.to_refbayes``), or back (inverse, ``layout.from_refbayes``)."""
    for ax, blocks in axes.items():
        p = _block_permutation(model, layout, blocks)
        a = np.take(a, np.argsort(p) if inverse else p, axis=ax)
    return a


def _convert(mine: np.ndarray, axes: dict, full_ndim: int, model, layout: str):
    """mine's parameter axes read in ``layout`` and put in refbayes' order; ``axes`` are those
    of the trace's full array (full_ndim dimensions), one fewer when the dump has no step axis.
    A dump whose shape does not fit is returned as it is (the shape check reports it)."""
    shift = full_ndim - mine.ndim
    axes = {a - shift: b for a, b in axes.items() if a - shift >= 0}
    if shift not in (0, 1) or any(a >= mine.ndim or mine.shape[a] != b * model.D
                                  for a, b in axes.items()):
        return mine
    return _reorder(mine, axes, model, layout, inverse=False)


def _tag(trace, name: str) -> str:
    if name in _COMPUTED_INPUTS:
        return trace.tags.get(name) or _COMPUTED_INPUTS[name][1]
    return trace.tags.get(name, "") if name in trace.outputs else "input"


def _index_in_layout(row: Row, model, layout: str, axes: dict) -> Row:
    """Row with its worst index's parameter-axis entries mapped from refbayes' order to the
    layout's (refbayes position j is the layout's position p[j], ``layout.permutation``)."""
    if not row.worst or not axes:
        return row
    perms = {ax: _block_permutation(model, layout, b) for ax, b in axes.items()}
    return row._replace(worst=tuple(int(perms[ax][i]) if ax in perms else i
                                    for ax, i in enumerate(row.worst)))


def _layout_hint(ok, mine: np.ndarray, axes: dict, model, layout: str) -> str:
    """Name a layout mistake when mine, which diverges, matches the trace up to a layout's
    permutation of its parameter axes (``ok(array)`` says whether an array matches), or ''.

    Output side: with ``layout`` refbayes, mine is still in another layout (to_refbayes of it
    matches). Input side: mine holds the trace's values read in another layout (from_refbayes
    of it matches), as the outputs of a framework's model fed the inputs in refbayes order do
    (elementwise in the inputs)."""
    others = layouts.LAYOUTS[1:]
    if layout == "refbayes":
        for other in others:
            if ok(_reorder(mine, axes, model, other, inverse=False)):
                return f"{_OUTPUT_SIDE}{other!r} layout: rerun with --layout {other}"
    for other in others:
        if ok(_reorder(mine, axes, model, other, inverse=True)):
            also = (f"; or your dump is in refbayes order: drop --layout {layout}"
                    if other == layout else "")
            return (f"{_INPUT_SIDE}{other} order: a layout mistake, on the input side if the "
                    f"inputs were fed in refbayes order (yours = the trace's vector read as a "
                    f"{other}-layout one: convert the inputs with refbayes.layout.from_refbayes "
                    f"before feeding them){also}")
    return ""


def _rtol_note(rtol: float, rule: list) -> str:
    """Say how far ``rtol`` moved the tolerances of the rule (``rule``: those it replaced)."""
    lo, hi = min(rule), max(rule)
    how = (f"up to {rtol / lo:.1e} times looser" if rtol > lo
           else f"at least {lo / rtol:.1e} times tighter")
    return (f"rtol {rtol:.2e} replaced the tolerance rule's {lo:.2e} to {hi:.2e} (measured "
            f"condition, float type) in {len(rule)} float comparisons: {how}")


# quantities renamed in the traces: method -> {former name: name}; a dump that still uses a
# former name is compared under the new one, with a note (kept one release, as the API's names)
FORMER_NAMES = {"noisy-adam": {"input.cfg.eta": "input.cfg.prior_precision"}}


def _former_names(method, mine, ref):
    """``mine`` with former names renamed where the trace has the new name and the dump lacks it,
    and the (former, new) pairs that were renamed."""
    renamed = [(old, new) for old, new in FORMER_NAMES.get(method, {}).items()
               if old in mine and new in ref and new not in mine]
    if not renamed:
        return mine, []
    swap = dict(renamed)
    return {swap.get(name, name): value for name, value in mine.items()}, renamed


def compare(trace, yours, *, layout: str = "refbayes", rtol: float | None = None) -> Report:
    """Compare a dump with a golden trace, quantity by quantity and step by step.

    Parameters
    ----------
    trace : str, pathlib.Path or tracing.Trace
        The golden trace (``refbayes trace METHOD --save FILE``).
    yours : str, pathlib.Path or mapping
        Your dump: an npz path or a mapping of the trace's names to arrays.
    layout : {"refbayes", "torch", "flax"}, default "refbayes"
        The parameter order of your arrays' D axes (``refbayes.layout``).
    rtol : float or None, default None
        A relative tolerance for every float quantity instead of the rule of the module
        docstring, below 1 (at rtol >= 1 a dump of zeros passes, its error max|0 - b| / max|b|
        being 1); the report's notes say how far it moved the rule's tolerances.

    Returns
    -------
    Report
        Every comparison; ``report.ok`` and ``report.first_failure`` summarise it.

    Raises
    ------
    FileNotFoundError
        If a file does not exist.
    ValueError
        If the trace is not a readable golden trace, the dump is not numeric (or a damaged npz),
        holds none of the trace's quantities, the layout is unknown, or rtol is not a finite
        number in (0, 1).
    """
    if not isinstance(trace, tracing.Trace):
        trace = _read_file(trace, "trace", tracing.load)
    mine_all = load_dump(yours)
    if layout not in layouts.LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(layouts.LAYOUTS)}, got {layout!r}")
    if rtol is not None and not (isinstance(rtol, (int, float)) and np.isfinite(rtol)
                                 and 0 < rtol < 1):
        raise ValueError(f"rtol: expected a positive finite number below 1, got {rtol!r}: at "
                         f"rtol >= 1 a dump of zeros passes every float quantity (its error "
                         f"max|0 - b| / max|b| is 1), so the comparison would say nothing")
    ref_all = {**trace.inputs, **trace.outputs}
    mine_all, renamed = _former_names(trace.method, mine_all, ref_all)
    known = [n for n in mine_all if n in ref_all]
    if not known:
        raise ValueError(f"yours: none of the {len(ref_all)} quantities of the {trace.method} "
                         f"trace is in the dump (it has {', '.join(sorted(mine_all)) or 'nothing'})"
                         f"; expected names such as {', '.join(list(trace.outputs)[:6])}")
    notes = [f"{old} is the former name of {new}, compared under the new name (the old name "
             "goes in the next release; docs: Changes)" for old, new in renamed]
    made_by = trace.manifest.get("refbayes_version")
    if made_by != __version__:
        notes.append(f"the trace was made by refbayes {made_by}; this is refbayes {__version__}: "
                     f"its values are what refbayes {made_by} computed")
    try:
        model = tracing.model_from_spec(trace.model)
    except ValueError:
        if layout != "refbayes":
            raise
        model = None  # no layout hints for a model that cannot be rebuilt
    D = model.D if model is not None else None
    if layout != "refbayes":
        notes.append(f"parameter axes read in the {layout!r} layout")
    sign_free = set(trace.manifest.get("sign_free", []))
    absolute = trace.manifest.get("absolute", {})
    default_note = trace.manifest.get("derivation", "")
    rows, rule = [], []
    K = max((a.shape[0] for a in trace.outputs.values()), default=1)
    per_step_names = set(trace.outputs) | set(trace.per_step)
    full_axes = {n: _layout_axes(trace, n, ref_all[n], D) for n in known}

    def one(name, step_index, mine_k, ref_k):
        tag = _tag(trace, name)
        axes = _step_axes(full_axes[name], name in per_step_names)
        args = (name, step_index + 1)
        condition = trace.condition.get(name) if name in trace.outputs else None
        rest = (ref_k, tag, tracing.derivation_of(tag, default_note), condition, rtol,
                name in sign_free, absolute.get(name))
        if rtol is not None and ref_k.dtype.kind == "f" and absolute.get(name) is None:
            rule.append(tolerance(_precision(ref_k, np.asarray(mine_k)), condition))
        row = _compare_one(*args, mine_k, *rest)
        if row.status == "diverges" and model is not None and axes:
            hint = _layout_hint(lambda a: _compare_one(*args, a, *rest).ok, mine_k, axes, model,
                                layout)
            if hint:
                row = row._replace(detail=hint)
        if layout != "refbayes":  # report positions as the dump holds them
            row = _index_in_layout(row, model, layout, axes)
        return row

    prepared = {}
    for name in known:
        ref, mine = ref_all[name], mine_all[name]
        per_step = name in per_step_names
        if layout != "refbayes" and full_axes[name]:
            mine = _convert(mine, full_axes[name], ref.ndim, model, layout)
        steps = _steps_of(mine, ref, per_step)
        if steps is None:
            expected = (f"{tuple(ref.shape)} (all {K} steps), (k,) + {tuple(ref.shape[1:])} for the "
                        f"first k steps, or {tuple(ref.shape[1:])} (step 1)" if per_step
                        else f"{tuple(ref.shape)}")
            per = ref.shape[1:] if per_step else ref.shape
            hint = "; the same sizes in another order: transposed? (a torch weight is (n_out, " \
                "n_in): see --layout)" if sorted(mine.shape) in (sorted(per), sorted(ref.shape)) else ""
            tag = _tag(trace, name)
            prepared[name] = Row(name, 1, tag, tracing.derivation_of(tag, default_note), "shape",
                                 np.nan, np.nan, np.nan, (), np.nan, np.nan,
                                 f"expected shape {expected}, got {tuple(mine.shape)}{hint}")
            continue
        prepared[name] = (steps, ref)
    if layout != "refbayes":
        flat = [n for n in _MU_RHO + _RHO if n in prepared and not full_axes[n]
                and ref_all[n].dtype.kind == "f"]
        if flat:
            notes.append(f"compared in refbayes order, not read in the {layout!r} layout: "
                         f"{', '.join(flat)}: they run over [mu; rho] or rho, and the trace has "
                         f"not recorded a {layout} layout of this rho (only axes of length "
                         f"D = {D}, and BBB's two D-blocks, are converted)")

    # the comparison order: the fed inputs, then step by step the outputs, each computed input
    # after the quantity it is computed from
    computed = [n for n in _COMPUTED_INPUTS if n in trace.inputs]
    order = list(trace.outputs)
    for name in computed:
        after = _COMPUTED_INPUTS[name][0]
        order.insert(order.index(after) + 1 if after in order else 0, name)

    def compare_all(name, k):
        steps, ref = prepared[name]
        if name in per_step_names:
            return [one(name, k, steps[k], ref[k])] if k < steps.shape[0] else []
        return [one(name, 0, steps[0], ref)] if k == 0 else []

    for name in (n for n in trace.inputs if n in prepared and n not in computed):
        if isinstance(prepared[name], Row):  # a wrong shape, in its place in the order
            rows.append(prepared[name])
        elif name in per_step_names:
            rows += [r for k in range(prepared[name][0].shape[0]) for r in compare_all(name, k)]
        else:
            rows += compare_all(name, 0)
    for k in range(K):
        for name in (n for n in order if n in prepared):
            if isinstance(prepared[name], Row):
                rows += [prepared[name]] if k == 0 else []
            else:
                rows += compare_all(name, k)
    if rtol is not None and rule:
        notes.append(_rtol_note(rtol, rule))
    not_dumped = [n for n in trace.outputs if n not in mine_all]
    ignored = sorted(n for n in mine_all if n not in ref_all)
    return Report(trace.method, rows, not_dumped, ignored, notes)


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.2e}"


def format_report(report: Report) -> str:
    """Format a report: the table of comparisons, then the first divergence in words.

    Parameters
    ----------
    report : Report
        From ``compare``.

    Returns
    -------
    str
        The text, ending with a newline.
    """
    table = format_table(
        ["step", "quantity", "tag", "max abs err", "max rel err", "tol", "worst index", "verdict"],
        [[r.step, r.name, r.tag or "-", _fmt(r.max_abs), _fmt(r.max_rel), _fmt(r.tol),
          str(r.worst) if r.worst and r.max_abs != 0 else "-", "ok" if r.ok else r.status.upper()]
         for r in report.rows])
    lines = [f"refbayes verify: {report.method}, {len(report.rows)} comparisons", table]
    lines += [f"note: {n}" for n in report.notes]
    if report.ignored:
        lines.append(f"ignored (not in the trace): {', '.join(report.ignored)}")
    if report.not_dumped:
        lines.append(f"not in your dump: {', '.join(report.not_dumped)}")
    bad = report.first_failure
    if bad is None:
        lines.append(f"OK: every compared quantity agrees ({len(report.rows)} comparisons).")
    else:
        where = f" at index {bad.worst}" if bad.worst else ""
        values = "" if bad.yours != bad.yours else \
            f" (yours {bad.yours:.10g}, trace {bad.reference:.10g})"
        lines.append(
            f"FIRST DIVERGENCE: step {bad.step}, {bad.name} {bad.tag or '(untagged)'}, derived in "
            f"{bad.derivation}: {bad.status}; max abs err {_fmt(bad.max_abs)}, max rel err "
            f"{_fmt(bad.max_rel)} > tol {_fmt(bad.tol)}{where}{values}"
            + (f"; {bad.detail}" if bad.detail else ""))
        if bad.detail.startswith((_OUTPUT_SIDE, _INPUT_SIDE)):
            lines.append("Its values match the trace up to a parameter permutation: a layout "
                         "mistake, not that equation: fix the layout first.")
        else:
            lines.append("Every quantity compared before it agrees: check that equation first.")
        n_bad = sum(not r.ok for r in report.rows)
        lines.append(f"{n_bad} of {len(report.rows)} comparisons fail.")
    return "\n".join(lines) + "\n"


def assert_matches(trace, yours, *, layout: str = "refbayes", rtol: float | None = None) -> Report:
    """Assert that a dump matches a golden trace (for a pytest test), naming the first divergence.

    Parameters
    ----------
    trace : str, pathlib.Path or tracing.Trace
        The golden trace.
    yours : str, pathlib.Path or mapping
        Your dump.
    layout : {"refbayes", "torch", "flax"}, default "refbayes"
        The parameter order of your arrays' D axes.
    rtol : float or None, default None
        A tolerance overriding the rule.

    Returns
    -------
    Report
        The report, when everything agrees.

    Raises
    ------
    AssertionError
        With the formatted report, when a quantity diverges or has the wrong shape.
    """
    report = compare(trace, yours, layout=layout, rtol=rtol)
    if not report.ok:
        raise AssertionError("\n" + format_report(report))
    return report


def add_arguments(parser) -> None:
    """Add the ``refbayes verify`` arguments to an argparse parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The ``verify`` subcommand's parser.
    """
    parser.add_argument("trace", metavar="TRACE", help="golden trace (.npz) from `refbayes trace "
                                                       "METHOD --save`")
    parser.add_argument("yours", metavar="YOURS", help="your dump (.npz): any of the trace's "
                                                       "names, (K, ...), (k, ...) or per step")
    parser.add_argument("--layout", default="refbayes",
                        help="parameter order of your D axes: refbayes (default), torch "
                             "(nn.Linear weight (n_out, n_in), then bias) or flax")
    parser.add_argument("--rtol", type=float, default=None,
                        help="one relative tolerance in (0, 1) for every quantity instead of the "
                             "rule (float32/float64 and measured condition; see the module "
                             "docstring); the report says how far it moved the rule's")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the rows as JSON")


def run(args) -> int:
    """Run the ``refbayes verify`` handler: print the report; exit 0 when all agrees, else 1.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of ``add_arguments``.

    Returns
    -------
    int
        0 when every compared quantity agrees, 1 otherwise.

    Raises
    ------
    ValueError
        For the errors of ``compare``, and when --json cannot be written (after the report is
        printed).
    """
    report = compare(args.trace, args.yours, layout=args.layout, rtol=args.rtol)
    print(format_report(report), end="")
    if args.json is not None:
        def clean(v):
            return None if isinstance(v, float) and not np.isfinite(v) else v
        rows = [{**{k: clean(v) for k, v in r._asdict().items()}, "worst": list(r.worst),
                 "ok": r.ok} for r in report.rows]
        doc = {"method": report.method, "ok": report.ok, "rows": rows,
               "not_dumped": report.not_dumped, "ignored": report.ignored, "notes": report.notes}
        try:
            written = atomic_write_text(args.json, json.dumps(doc, indent=1) + chr(10))
        except OSError as err:  # not the temporary file's name: the path asked for
            raise cannot_write("--json", args.json, err) from None
        print(f"json: {written}")
    return 0 if report.ok else 1
