"""The tracer registry and ``build``: run a registered method, measure each output's condition
number in float32, and fill in the manifest (``derivations/tracing.md``, "Condition").

Registration flows one way: each recipe module of ``refbayes.tracing`` calls ``register`` at
import, and ``refbayes.tracing`` imports every recipe; nothing here imports a recipe.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from refbayes import __version__
from refbayes._checks import check_int
from refbayes._tolerances import rel_err
from refbayes.tracing.files import FORMAT, FORMAT_VERSION, Trace, read_manifest, save
from refbayes.tracing.scales import input_scale, scale_of

__all__ = ["CONDITION_RULES", "DTYPES", "TRACERS", "Tracer", "bless", "build", "command_line", "get_tracer", "main",
           "one_of", "register"]

DTYPES = ("float64", "float32")
U32 = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff, 2^-24


class Tracer(NamedTuple):
    """How one method is traced.

    Attributes
    ----------
    name : str
        The method's name on the command line.
    derivation : str
        The derivation note of its equations, e.g. 'derivations/vogn.md'.
    run : callable
        ``run(seed, steps, dtype, **options) -> (inputs, outputs, tags, config, model,
        per_step)``: per_step the names of the inputs with a leading step axis.
    options : dict
        The method's own options and their defaults (``refbayes trace`` flags).
    chained : bool
        Whether ``steps`` may exceed 1: K chained steps, or swag's T SGD steps (else the trace is
        one fit and steps must be 1).
    float32 : bool
        Whether the method can be traced in float32.
    default_steps : int
        ``steps`` when not given (swag: T = 6).
    sign_free : tuple of str
        Outputs whose columns are eigenvectors, compared up to sign (SLANG's U).
    absolute : tuple of (str, float)
        Outputs that vanish in exact arithmetic (a gradient at the MAP), with the absolute bound
        they are compared with: relative to their own rounding-level scale an error means
        nothing.
    rounded : callable or None
        For a method traced in float64 only: ``rounded(seed, steps, **options) -> outputs``,
        the run in float64 on its inputs rounded to float32, from which ``build`` measures the
        condition numbers (``CONDITION_RULES["rounded"]``); None for the float32 methods.
    note : str
        What the printed trace and the manifest must say of the traced order (noisy-kfac: which
        factors precondition the step), '' for none.
    models : tuple of str
        The models it can be traced on besides its shipped one (``build``'s ``model``, ``refbayes
        trace METHOD --model``; ``problems.MODELS``), () for none; ``run`` then takes
        ``model=``.
    """
    name: str
    derivation: str
    run: Callable
    options: dict
    chained: bool = True
    float32: bool = True
    default_steps: int = 1
    sign_free: tuple = ()
    absolute: tuple = ()
    rounded: Callable | None = None
    note: str = ""
    models: tuple = ()


# How each trace's condition numbers were measured (the manifest's "condition_rule"); the float
# outputs of every trace are measured by one of the two, and the integer ones (counts, indices)
# are compared exactly and carry null.
CONDITION_RULES = {
    "float32": "kappa = rel_err(float32 run, float64 run) / 2^-24: the same inputs rounded to "
               "float32 and the whole step run in float32 (rel_err of refbayes._tolerances); "
               "null for an integer output (compared exactly) and for an output compared by "
               "its absolute error (the manifest's absolute)",
    "rounded": "kappa = rel_err(float64 run on the inputs rounded to float32, float64 run) / "
               "2^-24: this method is traced in float64 only (its fit needs float64: a MAP "
               "to |grad| < 1e-10, an ODE solve), so kappa measures how much the quantity "
               "amplifies a relative perturbation of its inputs of the size of float32 "
               "rounding, not the rounding inside the fit; null for an integer output "
               "(compared exactly) and for an output compared by its absolute error (the "
               "manifest's absolute: a gradient that vanishes at the MAP)",
}


# filled by the recipe modules, in the order refbayes.tracing imports them
TRACERS: dict[str, Tracer] = {}


def register(tracer: Tracer) -> None:
    """Register a method's tracer (each recipe module of refbayes.tracing registers its own).

    Parameters
    ----------
    tracer : Tracer
        The tracer; its name must be new.

    Raises
    ------
    ValueError
        If a tracer of that name exists.
    """
    if tracer.name in TRACERS:
        raise ValueError(f"tracer: {tracer.name!r} is registered already")
    TRACERS[tracer.name] = tracer


def _param_axes(a: np.ndarray, D: int, per_step: bool) -> tuple:
    start = 1 if per_step else 0
    return tuple(i for i in range(start, a.ndim) if a.shape[i] == D)


def get_tracer(method) -> Tracer:
    """Find the registered tracer of a method.

    Parameters
    ----------
    method : str
        A key of ``TRACERS``.

    Returns
    -------
    Tracer
        Its tracer.

    Raises
    ------
    ValueError
        If no method of that name is traced; the message lists the traced ones.
    """
    if method not in TRACERS:
        raise ValueError(f"method: expected one of {', '.join(TRACERS)}, got {method!r}")
    return TRACERS[method]


def one_of(value, name: str, allowed, method: str):
    """Check that a trace option takes one of its allowed values.

    Parameters
    ----------
    value : object
        The option's value.
    name : str
        The option's name, for the message.
    allowed : sequence of str
        Its allowed values.
    method : str
        The traced method, for the message.

    Returns
    -------
    object
        The value, unchanged.

    Raises
    ------
    ValueError
        If value is not one of allowed.
    """
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)} for {method}, "
                         f"got {value!r}")
    return value


def command_line(method: str, options: dict) -> str:
    """Write the ``refbayes trace`` command that builds a trace with these options.

    Parameters
    ----------
    method : str
        The traced method.
    options : dict
        The seed, steps, dtype and the method's options.

    Returns
    -------
    str
        E.g. 'refbayes trace vogn --seed 0 --steps 2 --dtype float64 --M 8 --S 2 --save FILE'.
    """
    parts = ["refbayes", "trace", method]
    for name, value in options.items():
        if value is None:
            continue
        flag = "--" + (name if len(name) == 1 and name.isupper() else name.replace("_", "-"))
        parts += [flag, str(value)]
    return " ".join(parts + ["--save", "FILE"])


def build(method: str, *, seed: int = 0, steps: int | None = None, dtype: str = "float64",
          model: str | None = None, **options) -> Trace:
    """Trace a method: run it, and measure each float output's condition number.

    By a float32 run of the same inputs where the method runs in float32, else by a float64 run
    on the inputs rounded to float32 (``Tracer.rounded``); the manifest's ``condition_rule``
    says which (``CONDITION_RULES``).

    Parameters
    ----------
    method : str
        A key of ``TRACERS``.
    seed : int, default 0
        Seed of the draws, >= 0.
    steps : int or None, default None
        K >= 1 chained steps (None: the tracer's default, 1, or swag's T = 6 SGD steps); 1 for
        the methods traced as one fit.
    dtype : {"float64", "float32"}, default "float64"
        Precision of the traced run.
    model : str or None, default None
        None: the method's shipped model; else one of ``TRACERS[method].models`` ("tiny-cnn":
        ``problems.cnn_problem``), recorded in the manifest's options (after dtype) and command.
    **options
        The method's options (``TRACERS[method].options``); unset ones take their defaults.

    Returns
    -------
    Trace
        The trace, its manifest filled in.

    Raises
    ------
    ValueError
        For an unknown method or option, an option out of range, steps > 1 for a fit, float32
        for a method traced in float64 only, or a model the method is not traced on.
    """
    tracer = get_tracer(method)
    if model is not None and model not in tracer.models:
        if not tracer.models:
            raise ValueError(f"model: {method} is traced on its shipped model only, got "
                             f"{model!r}")
        raise ValueError(f"model: expected one of {', '.join(tracer.models)} for {method} (or "
                         f"none: its shipped model), got {model!r}")
    seed = check_int(seed, "seed", low=0)
    steps = check_int(tracer.default_steps if steps is None else steps, "steps", low=1)
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    unknown = sorted(set(options) - set(tracer.options))
    if unknown:
        raise ValueError(f"options: {method} takes {', '.join(tracer.options) or 'none'}, got "
                         f"{', '.join(unknown)}")
    if steps > 1 and not tracer.chained:
        raise ValueError(f"steps: {method} is traced as one fit; expected 1, got {steps}")
    if dtype == "float32" and not tracer.float32:
        raise ValueError(f"dtype: {method} is traced in float64 only, got 'float32'")
    opts = {**tracer.options, **{k: v for k, v in options.items() if v is not None}}
    chosen = {} if model is None else {"model": model}
    inputs, outputs, tags, config, spec, per_step = tracer.run(seed, steps, dtype, **chosen,
                                                               **opts)
    condition = dict.fromkeys(outputs)
    rule = None
    if tracer.float32:
        other = tracer.run(seed, steps, "float32" if dtype == "float64" else "float64", **chosen,
                           **opts)[1]
        f64, f32 = (outputs, other) if dtype == "float64" else (other, outputs)
        rule = "float32"
    elif tracer.rounded is not None:
        f64, f32 = outputs, tracer.rounded(seed, steps, **chosen, **opts)
        rule = "rounded"
    if rule is not None:
        for name in outputs:
            if outputs[name].dtype.kind == "f" and name not in dict(tracer.absolute):
                with np.errstate(invalid="ignore", over="ignore"):
                    err = rel_err(f32[name], f64[name])
                condition[name] = max(1.0, err / U32) if np.isfinite(err) else float("inf")
    D = spec["D"]
    # the data rows are never a parameter axis (swag's (T, M, ...) batches with T = D = 6)
    param_axes = {n: () if n.startswith("input.batch.") else
                  _param_axes(a, D, per_step=n in per_step or n in outputs)
                  for n, a in {**inputs, **outputs}.items()}
    full = {"seed": seed, "steps": steps, "dtype": dtype, **chosen, **opts}
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "refbayes_version": __version__,
        "method": method, "command": command_line(method, full), "options": full,
        "derivation": tracer.derivation, "model": spec, "config": config,
        "order": list(outputs), "sign_free": list(tracer.sign_free),
        "absolute": dict(tracer.absolute),
        "condition_rule": CONDITION_RULES[rule] if rule else None,
        "note": tracer.note,
        "inputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype), "tag": tags.get(n, ""),
                       "scale": input_scale(n), "param_axes": list(param_axes[n]),
                       "per_step": n in per_step}
                   for n, a in inputs.items()},
        "outputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype), "tag": tags.get(n, ""),
                        "scale": scale_of(method, n), "param_axes": list(param_axes[n]),
                        "condition": condition[n]}
                    for n, a in outputs.items()},
    }
    return Trace(method, full, inputs, outputs, tags, param_axes, condition, config, spec,
                 sorted(per_step), manifest)


def bless(folder) -> list[Path]:
    """Rebuild every golden trace in a folder from its own manifest's options, and overwrite it.

    A trace of an older format version is rebuilt in the current one from the same options.

    For an intended numerical change: run it (``python -m refbayes.tracing tests/golden``), look
    at ``git diff --stat``, and commit the files with the reason.

    Parameters
    ----------
    folder : str or pathlib.Path
        A folder of ``*.npz`` golden traces.

    Returns
    -------
    list of pathlib.Path
        The files rewritten.

    Raises
    ------
    FileNotFoundError
        If the folder does not exist or holds no trace.
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.npz")) if folder.is_dir() else []
    if not files:
        raise FileNotFoundError(f"folder: no *.npz golden traces in {folder}")
    for path in files:
        old = read_manifest(path)  # any format version: its method and options
        save(build(old["method"], **old["options"]), path)
    return files


def main(argv=None) -> int:
    """Bless the golden traces of the folders given (``python -m refbayes.tracing FOLDER``).

    Parameters
    ----------
    argv : list of str, optional
        The folders (default: sys.argv[1:]).

    Returns
    -------
    int
        The exit status, 0.
    """
    folders = list(sys.argv[1:] if argv is None else argv)
    for folder in folders:
        for path in bless(folder):
            print(f"rewrote {path}")
    return 0
