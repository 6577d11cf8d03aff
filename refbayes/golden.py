"""Golden traces: every method's inputs and named intermediates over K steps, in one portable file.

A golden trace is what another implementation is verified against (``refbayes verify``): the
problem, the starting state, every draw and minibatch, the config and the model, and every named
intermediate of every step under its equation tag. ``refbayes trace METHOD --save FILE`` writes
one; ``load`` reads it back; ``TRACERS`` says how each method is traced.

The file is an ``.npz`` (``numpy.savez``; every entry a numeric array, read with
``allow_pickle=False``) whose entry ``__manifest__`` holds the JSON manifest, also written beside
it as ``FILE.json`` for people and tools that do not read npz. The manifest records the format
version, the refbayes version, the method, the command that made the file and its options, the
model and config, and for every array its shape, dtype, equation tag, parameter axes and (for the
outputs) its measured condition number, the comparison order, and the derivation note.

Names. Inputs start with ``input.``: ``input.state.<field>`` the starting state (no step axis),
``input.batch.idx`` / ``input.batch.X`` / ``input.batch.y`` the minibatches, ``input.eps`` the
Gaussian draws (D, S), ``input.masks.<l>`` the dropout masks, ``input.Omega`` SLANG's randomized
test matrix, ``input.cfg.<field>`` the config's arrays (its scalars are in the manifest). Every
per-step input and every output carries a leading step axis of length K. Outputs are the fields
of the method's Info, in the equation order the step computes them, then ``state.<field>`` for
each field of the new state that the Info does not already hold.

Draws of chained steps. Step 1 consumes the draws of ``refbayes trace METHOD`` (for the methods
traced there first, in the order its module docstring gives; for the others, from
``rng = numpy.random.default_rng(seed)`` after the starting state: ``idx =
rng.permutation(N)[:M]``, then the step's noise as ``refbayes.methods.driver`` draws it). Step
k + 1 >= 2 draws from ``numpy.random.default_rng([seed, k])`` in the same order, so any prefix of
a K-step trace is the trace of fewer steps.

Condition. Where a method can run in float32, the trace is also run in float32 on the same
inputs rounded to float32, and each output's condition number is measured as
``kappa = rel_err(float32 run, float64 run) / u32`` (u32 = 2^-24, ``rel_err`` the scale-relative
error of ``refbayes._tolerances``): how much the step amplifies rounding on the way to that
quantity. ``refbayes.verify`` sets each quantity's tolerance from it. The methods traced in
float64 only (laplace, riemannian-laplace, swag, noisy-kfac, kfac) get no kappa, so a trace of
them is worth comparing at settings where its quantities are well conditioned: the committed
riemannian-laplace trace solves its geodesics with DOP853 at rtol = atol = 1e-12, because at the
official RK45 with atol = 1e-3 a MAP that moves by 1.5e-15 (one BLAS thread against two) moves
the end points c by 8.7e-4 and the end speed by 9.3e-2, relative.
"""
from __future__ import annotations

import functools
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from refbayes import __version__
from refbayes._checks import check_int
from refbayes._tolerances import rel_err
from refbayes.datasets import make_logistic_regression
from refbayes.methods import adam, bbb, driver, mc_dropout, noisy_adam, slang, vadam, vogn
from refbayes.methods._estimates import Batch
from refbayes.models import MLP, LogisticRegression, SoftmaxRegression

__all__ = ["FORMAT", "FORMAT_VERSION", "DTYPES", "Trace", "Tracer", "Chain", "TRACERS", "register",
           "build", "save", "load", "read_npz", "bless", "run_chain", "field_tags", "derivation_of",
           "arrays_of", "scalars_of", "cfg_arrays", "NOTE_OF", "model_spec", "model_from_spec", "command_line"]

FORMAT = "refbayes-golden-trace"
FORMAT_VERSION = 1
DTYPES = ("float64", "float32")
U32 = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff, 2^-24
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


# ----------------------------------------------------------------------------- tags and specs

_TAG = re.compile(r"\((\w+\.\d+)\)")
# tag prefixes whose note has another name: Adam's equations are derived in the BBB note
NOTE_OF = {"adam": "bbb", "data": "datasets", "peg": "per_example_gradients"}


@functools.lru_cache(maxsize=None)
def field_tags(cls) -> dict:
    """Read the equation tags off a NamedTuple's field comments.

    Every State / Info class of refbayes.methods ends each field line with a comment naming its
    equations, e.g. ``g_hat: Array  # ghat, (D,) (vogn.5), (vogn.6)``.

    Parameters
    ----------
    cls : type
        A NamedTuple class.

    Returns
    -------
    dict of str to str
        Field name to its tags joined by ', ' (e.g. '(vogn.5), (vogn.6)'), '' for none.
    """
    tags = dict.fromkeys(cls._fields, "")
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+)\s*:[^#]*#(.*)$", line)
        if m and m.group(1) in tags:
            tags[m.group(1)] = ", ".join(f"({t})" for t in _TAG.findall(m.group(2)))
    return tags


def derivation_of(tag: str, default: str) -> str:
    """Name the derivation note of a tag: '(vogn.5)' is derived in derivations/vogn.md.

    Parameters
    ----------
    tag : str
        One or more tags, e.g. '(bbb.4)' or '(ngvi.6) / (ngvi.9)'; the first decides.
    default : str
        The note to name when the tag is empty.

    Returns
    -------
    str
        The note's path relative to the repository root.
    """
    found = _TAG.findall(tag)
    if not found:
        return default
    prefix = found[0].split(".")[0]
    return f"derivations/{NOTE_OF.get(prefix, prefix)}.md"


def model_spec(model) -> dict:
    """Describe a model for a manifest: class, repr, D, sizes, bias and its constructor args.

    Parameters
    ----------
    model : FlatModel
        An MLP, LogisticRegression or SoftmaxRegression (others get no ``args``).

    Returns
    -------
    dict
        The spec; ``model_from_spec`` rebuilds the model from it.
    """
    spec = {"class": type(model).__name__, "repr": repr(model), "D": int(model.D),
            "sizes": [int(n) for n in model.sizes], "bias": bool(model.bias)}
    if isinstance(model, MLP):
        spec["args"] = {"sizes": spec["sizes"], "activation": model.activation,
                        "likelihood": model.likelihood.name,
                        "noise_precision": float(getattr(model.likelihood, "noise_precision",
                                                         1.0))}
    elif isinstance(model, LogisticRegression):
        spec["args"] = {"n_features": spec["sizes"][0], "intercept": spec["bias"]}
    elif isinstance(model, SoftmaxRegression):
        spec["args"] = {"n_features": spec["sizes"][0], "n_classes": spec["sizes"][-1],
                        "intercept": spec["bias"]}
    return spec


def model_from_spec(spec: dict):
    """Rebuild a trace's model from its manifest spec.

    Parameters
    ----------
    spec : dict
        ``Trace.model``.

    Returns
    -------
    FlatModel
        The model, equal to the traced one.

    Raises
    ------
    ValueError
        If the spec names a model class that cannot be rebuilt, or the rebuilt model's D differs.
    """
    classes = {"MLP": MLP, "LogisticRegression": LogisticRegression,
               "SoftmaxRegression": SoftmaxRegression}
    if spec.get("class") not in classes or "args" not in spec:
        raise ValueError(f"model: cannot rebuild {spec.get('repr', spec)!r} (known: "
                         f"{', '.join(classes)})")
    model = classes[spec["class"]](**spec["args"])
    if model.D != spec["D"]:
        raise ValueError(f"model: rebuilt {model!r} has D = {model.D}, the trace says {spec['D']}")
    return model


# ----------------------------------------------------------------------------- flattening

def _is_namedtuple(v) -> bool:
    return isinstance(v, tuple) and hasattr(v, "_fields")


def _numeric(v) -> bool:
    return isinstance(v, (bool, int, float, np.ndarray, np.generic)) and \
        np.asarray(v).dtype.kind in "biuf"


def arrays_of(prefix: str, value) -> dict:
    """Flatten a NamedTuple (nested, with lists of arrays) into named numeric arrays.

    Fields that are None, strings, models or other objects are left out.

    Parameters
    ----------
    prefix : str
        Prepended to every name, e.g. 'input.state.'.
    value : NamedTuple, dict, list or tuple
        The object to flatten.

    Returns
    -------
    dict of str to numpy.ndarray
        Names 'prefix + field', 'prefix + field.sub' and 'prefix + field.i' for list items.
    """
    out = {}
    if _is_namedtuple(value):
        items = value._asdict().items()
    else:
        items = value.items() if isinstance(value, dict) else enumerate(value)
    for name, v in items:
        key = f"{prefix}{name}"
        if isinstance(v, (list, tuple)):
            out.update(arrays_of(key + ".", v))
        elif _numeric(v):
            out[key] = np.array(v)
    return out


def scalars_of(cfg, prefix: str = "") -> dict:
    """Collect a config's scalar fields (nested configs as 'adam.alpha') as JSON values.

    Parameters
    ----------
    cfg : NamedTuple
        A method's Config.
    prefix : str, default ''
        Prepended to every name.

    Returns
    -------
    dict
        Name to bool, int, float, str or None; array fields are left out (``arrays_of``).
    """
    out = {}
    for name, v in cfg._asdict().items():
        if _is_namedtuple(v):
            out.update(scalars_of(v, f"{prefix}{name}."))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{name}"] = v
        elif isinstance(v, (np.generic, np.ndarray)) and np.ndim(v) == 0:
            out[f"{prefix}{name}"] = v.item()
    return out


def cfg_arrays(cfg) -> dict:
    """Name a config's array fields 'input.cfg.<field>' (its scalars are in ``scalars_of``).

    Parameters
    ----------
    cfg : NamedTuple
        A method's Config.

    Returns
    -------
    dict of str to numpy.ndarray
        The fields of at least one dimension (a (D,) prior precision, ...).
    """
    return {n: a for n, a in arrays_of("input.cfg.", cfg).items() if a.ndim > 0}


def _cast(value, dtype):
    """Cast every float array (and float scalar array) inside value to dtype; keep the rest."""
    if _is_namedtuple(value):
        return type(value)(*(_cast(v, dtype) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    return value


def _stack(per_step: list[dict]) -> dict:
    names = list(per_step[0])
    for k, d in enumerate(per_step):
        if list(d) != names:
            raise RuntimeError(f"step {k + 1} produced fields {list(d)}, step 1 {names}")
    return {n: np.stack([d[n] for d in per_step]) for n in names}


# ----------------------------------------------------------------------------- chained steps

class Chain(NamedTuple):
    """What a chained trace needs: the start, the step and how one step draws.

    Attributes
    ----------
    state : NamedTuple
        The starting state.
    cfg : NamedTuple
        The config.
    model : FlatModel
        The model.
    X : numpy.ndarray
        Training inputs (N, n_in).
    y : numpy.ndarray
        Training targets.
    M : int
        Minibatch rows.
    step : callable
        ``step(state, batch, noise, cfg, model, **kwargs) -> (state, info)``.
    draws : callable
        ``draws(rng, M) -> (noise, kwargs)``: the step's noise after its minibatch.
    rng : numpy.random.Generator
        The generator the start was drawn from; step 1 continues it.
    tags : dict of str to str or None
        Tags of the Info fields (None: read from the Info class's field comments).
    first : tuple or None
        (idx, noise, kwargs) of step 1 when drawn already (the ``refbayes trace`` recipes);
        None: step 1 draws from ``rng``.
    """
    state: Any
    cfg: Any
    model: Any
    X: Any
    y: Any
    M: int
    step: Callable
    draws: Callable
    rng: np.random.Generator | None
    tags: dict | None = None
    first: tuple | None = None


def _noise_arrays(noise, kwargs) -> dict:
    out = {}
    if isinstance(noise, list):
        out.update({f"input.masks.{l}": np.asarray(z) for l, z in enumerate(noise)})
    elif noise is not None:
        out["input.eps"] = np.asarray(noise)
    out.update({f"input.{k}": np.asarray(v) for k, v in kwargs.items()})
    return out


def run_chain(chain: Chain, seed: int, steps: int, dtype) -> tuple:
    """Take ``steps`` chained steps by the module docstring's draw rule, and collect them.

    Parameters
    ----------
    chain : Chain
        The start, step and draw rule, in float64.
    seed : int
        The trace's seed (steps k + 1 >= 2 draw from ``default_rng([seed, k])``).
    steps : int
        K >= 1.
    dtype : numpy dtype
        float64, or float32 (the start, data and draws rounded; the draws are the float64 ones).

    Returns
    -------
    tuple
        (inputs, outputs, tags, config, model spec, per-step input names) as in ``Tracer.run``.
    """
    dtype = np.dtype(dtype)
    state = _cast(chain.state, dtype)
    cfg = _cast(chain.cfg, dtype)
    X = _cast(chain.X, dtype)
    y = _cast(chain.y, dtype) if np.asarray(chain.y).dtype.kind == "f" else chain.y
    N = X.shape[0]
    inputs = arrays_of("input.state.", state)
    inputs.update(cfg_arrays(cfg))
    step_inputs, step_outputs = [], []
    info_tags, state_tags = None, field_tags(type(state))
    for k in range(steps):
        if k == 0 and chain.first is not None:
            idx, noise, kwargs = chain.first
        else:
            rng = chain.rng if k == 0 else np.random.default_rng([seed, k])
            idx = driver.epoch_batches(rng, N, chain.M)[0]
            noise, kwargs = chain.draws(rng, chain.M)
        noise, kwargs = _cast(noise, dtype), {n: _cast(v, dtype) for n, v in kwargs.items()}
        drawn = {"input.batch.idx": np.asarray(idx), "input.batch.X": X[idx],
                 "input.batch.y": y[idx], **_noise_arrays(noise, kwargs)}
        state, info = chain.step(state, Batch(X[idx], y[idx]), noise, cfg, chain.model, **kwargs)
        out = arrays_of("", info)
        extra = {f"state.{n}": a for n, a in arrays_of("", state).items()
                 if n.split(".")[0] not in info._fields}
        out.update(extra)
        if info_tags is None:
            info_tags = dict(chain.tags) if chain.tags is not None else field_tags(type(info))
        step_inputs.append(drawn)
        step_outputs.append(out)
    per_step = _stack(step_inputs)
    inputs.update(per_step)
    outputs = _stack(step_outputs)
    tags = {}
    for name in outputs:
        head = name.split(".")[0]
        if name.startswith("state."):
            tags[name] = state_tags.get(name.split(".")[1], "")
        else:
            tags[name] = info_tags.get(head, "")
    for name in inputs:
        if name.startswith("input.state."):
            tags[name] = state_tags.get(name.split(".")[2], "")
    return inputs, outputs, tags, scalars_of(cfg), model_spec(chain.model), set(per_step)


# ----------------------------------------------------------------------------- the problems

N_ROWS = 50
N_FEATURES = 5
PROBLEM_SEED = 0
MLP_SIZES = (N_FEATURES, 4, 2)  # D = 34: no other dimension of the traces equals it
MEAN_SCALE = 0.5                # mu = MEAN_SCALE * rng.standard_normal(D)


def _mlp_problem():
    """The drivers' problem: make_logistic_regression(50, 5, seed 0), its labels the two classes
    of MLP([5, 4, 2], tanh, categorical)."""
    X, y, _ = make_logistic_regression(N_ROWS, N_FEATURES, PROBLEM_SEED)
    model = MLP(list(MLP_SIZES), activation="tanh", likelihood="categorical")
    return model, X, y


def _driver_chain(state, cfg, model, X, y, M, S, rng, oversample: int = 10) -> Chain:
    """A chain whose step and draws are the driver's for (state, cfg)."""
    method = driver._method(state, cfg)

    def draws(rng, M):
        return method.draws(rng, cfg, model, M, S, oversample, np.float64, np)

    return Chain(state, cfg, model, X, y, M, method.step, draws, rng)


def _vogn_chain(seed, *, M=8, S=2, curvature="ef"):
    model, X, y = _mlp_problem()
    rng = np.random.default_rng(seed)
    mu = MEAN_SCALE * rng.standard_normal(model.D)
    s = rng.uniform(0.5, 1.5, model.D)
    cfg = vogn.VOGNConfig(N_ROWS, delta=1.0, alpha=0.1, curvature=curvature)
    return _driver_chain(vogn.init(mu, s), cfg, model, X, y, M, S, rng)


def _adam_family_chain(name):
    def chain(seed, *, M=8, S=2):
        model, X, y = _mlp_problem()
        rng = np.random.default_rng(seed)
        mu = MEAN_SCALE * rng.standard_normal(model.D)
        if name == "vadam":
            state, cfg = vadam.init(mu), vadam.VadamConfig(N_ROWS, lam=1.0, alpha=0.1)
        elif name == "vprop":
            state, cfg = vadam.init(mu), vadam.vprop_config(N_ROWS, lam=1.0, alpha=0.1)
        elif name == "noisy-adam":
            state, cfg = noisy_adam.init(mu), noisy_adam.NoisyAdamConfig(N_ROWS, eta=1.0,
                                                                          alpha=0.1)
        elif name == "bbb":
            state, cfg = bbb.init(mu, sigma0=0.3), bbb.BBBConfig(N_ROWS, lam=1.0, alpha=0.1)
        elif name == "mc-dropout":
            state = mc_dropout.init(mu)
            cfg = mc_dropout.MCDropoutConfig(N_ROWS, p=0.3, lengthscale=1.0, alpha=0.1)
        else:  # adam: MAP
            state = adam.init(mu)
            cfg = adam.MAPConfig(N_ROWS, lam=1.0, adam=adam.AdamConfig(alpha=0.1))
        return _driver_chain(state, cfg, model, X, y, M, S, rng)
    return chain


def _slang_mlp_chain(seed, *, M=8, S=2, L=3):
    model, X, y = _mlp_problem()
    rng = np.random.default_rng(seed)
    D = model.D
    mu = MEAN_SCALE * rng.standard_normal(D)
    U = 0.5 * rng.standard_normal((D, L))
    d = rng.uniform(0.5, 1.5, D)
    cfg = slang.SLANGConfig(N=N_ROWS, lam=np.ones(D), L=L)
    return _driver_chain(slang.init(mu, U, d), cfg, model, X, y, M, S, rng)


def _trace_chain(make_chain) -> Callable:
    """A Tracer.run for a chained method from its chain builder."""
    def run(seed, steps, dtype, **options):
        return run_chain(make_chain(seed, **options), seed, steps, dtype)
    return run


TRACERS: dict[str, Tracer] = {
    "vogn": Tracer("vogn", "derivations/vogn.md", _trace_chain(_vogn_chain),
                   {"M": 8, "S": 2, "curvature": "ef"}),
    "ogn": Tracer("ogn", "derivations/vogn.md",
                  _trace_chain(lambda seed, **o: _vogn_chain(seed, S=0, **o)),
                  {"M": 8, "curvature": "ef"}),
    "vadam": Tracer("vadam", "derivations/vadam.md", _trace_chain(_adam_family_chain("vadam")),
                    {"M": 8, "S": 2}),
    "vprop": Tracer("vprop", "derivations/vadam.md", _trace_chain(_adam_family_chain("vprop")),
                    {"M": 8, "S": 2}),
    "noisy-adam": Tracer("noisy-adam", "derivations/noisy_adam.md",
                         _trace_chain(_adam_family_chain("noisy-adam")), {"M": 8, "S": 2}),
    "bbb": Tracer("bbb", "derivations/bbb.md", _trace_chain(_adam_family_chain("bbb")),
                  {"M": 8, "S": 2}),
    "mc-dropout": Tracer("mc-dropout", "derivations/mc_dropout.md",
                         _trace_chain(_adam_family_chain("mc-dropout")), {"M": 8}),
    "adam": Tracer("adam", "derivations/vadam.md", _trace_chain(_adam_family_chain("adam")),
                   {"M": 8}),
    "slang-mlp": Tracer("slang-mlp", "derivations/slang.md", _trace_chain(_slang_mlp_chain),
                        {"M": 8, "S": 2, "L": 3}, sign_free=("U",)),
}


def register(tracer: Tracer) -> None:
    """Register a method's tracer (each method module's trace registers itself here).

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


# ----------------------------------------------------------------------------- build, save, load

def _param_axes(a: np.ndarray, D: int, per_step: bool) -> tuple:
    start = 1 if per_step else 0
    return tuple(i for i in range(start, a.ndim) if a.shape[i] == D)


def _check_tracer(method) -> Tracer:
    import refbayes.trace  # noqa: F401  (registers the methods it traces first)
    if method not in TRACERS:
        raise ValueError(f"method: expected one of {', '.join(TRACERS)}, got {method!r}")
    return TRACERS[method]


def command_line(method: str, options: dict) -> str:
    """Write the ``refbayes trace`` command that builds a trace with these options.

    Parameters
    ----------
    method : str
        The traced method.
    options : dict
        seed, steps, dtype and the method's options.

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
          **options) -> Trace:
    """Trace a method: run it, and (where it runs in float32) measure each output's condition.

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
    **options
        The method's options (``TRACERS[method].options``); unset ones take their defaults.

    Returns
    -------
    Trace
        The trace, its manifest filled in.

    Raises
    ------
    ValueError
        For an unknown method or option, an option out of range, steps > 1 for a fit, or
        float32 for a method traced in float64 only.
    """
    tracer = _check_tracer(method)
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
    inputs, outputs, tags, config, model, per_step = tracer.run(seed, steps, dtype, **opts)
    condition = dict.fromkeys(outputs)
    if tracer.float32:
        other = tracer.run(seed, steps, "float32" if dtype == "float64" else "float64", **opts)[1]
        f64, f32 = (outputs, other) if dtype == "float64" else (other, outputs)
        for name in outputs:
            if outputs[name].dtype.kind == "f":
                with np.errstate(invalid="ignore", over="ignore"):
                    err = rel_err(f32[name], f64[name])
                condition[name] = max(1.0, err / U32) if np.isfinite(err) else float("inf")
    D = model["D"]
    param_axes = {n: _param_axes(a, D, per_step=n in per_step or n in outputs)
                  for n, a in {**inputs, **outputs}.items()}
    full = {"seed": seed, "steps": steps, "dtype": dtype, **opts}
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "refbayes_version": __version__,
        "method": method, "command": command_line(method, full), "options": full,
        "derivation": tracer.derivation, "model": model, "config": config,
        "order": list(outputs), "sign_free": list(tracer.sign_free),
        "absolute": dict(tracer.absolute),
        "inputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype), "tag": tags.get(n, ""),
                       "param_axes": list(param_axes[n]), "per_step": n in per_step}
                   for n, a in inputs.items()},
        "outputs": {n: {"shape": list(a.shape), "dtype": str(a.dtype), "tag": tags.get(n, ""),
                        "param_axes": list(param_axes[n]), "condition": condition[n]}
                    for n, a in outputs.items()},
    }
    return Trace(method, full, inputs, outputs, tags, param_axes, condition, config, model,
                 sorted(per_step), manifest)


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
    from refbayes.experiments._io import atomic_write_npz, atomic_write_text
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
        raise ValueError(f"trace: {path} has format {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"trace: {path} has format version {manifest.get('format_version')}, this "
                         f"refbayes (version {__version__}) reads version {FORMAT_VERSION}; "
                         f"rebuild it with: {manifest.get('command', 'refbayes trace METHOD')}")
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


def bless(folder) -> list[Path]:
    """Rebuild every golden trace in a folder from its own manifest's options, and overwrite it.

    For an intended numerical change: run it (``python -m refbayes.golden tests/golden``), look
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
        old = load(path)
        save(build(old.method, **old.options), path)
    return files


def main(argv=None) -> int:
    """Bless the golden traces of the folders given (``python -m refbayes.golden FOLDER``).

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


if __name__ == "__main__":
    # `python -m` runs this file as __main__; refbayes.trace registers its methods in the
    # imported refbayes.golden, so run that module's main
    from refbayes.golden import main as _main
    sys.exit(_main())
