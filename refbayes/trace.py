"""``refbayes trace METHOD``: one step on a small shipped problem, every named intermediate printed
under its Algorithm 1 line and equation tag.

The point is verification: another implementation (PyTorch, JAX, ...) is fed the same problem,
state and draws, takes one step, and compares its intermediates with these, one equation at a
time. So everything a step consumes is printed (and, with ``--json``, written exactly):

- the problem: ``make_logistic_regression(n=50, p=5, seed=0)`` (X (50, 5), y (50,)), the model
  ``LogisticRegression(5)`` with its intercept as the last parameter, D = 6, N = 50, prior
  precision lam = 1 on every parameter;
- the draws, all from ``rng = numpy.random.default_rng(seed)`` in this order: the starting state
  ``mu = 0.5 * rng.standard_normal(D)``, ``U = 0.5 * rng.standard_normal((D, L))``,
  ``d = rng.uniform(0.5, 1.5, D)``, ``g_bar = rng.standard_normal(D)`` (only when t > 0; at
  t = 0 it is zero, as after ``init``), then the minibatch ``idx = rng.permutation(N)[:M]`` (the
  driver's first batch of an epoch), then ``eps = rng.standard_normal((D, S))`` (not for
  curvature "exact"). The full Gaussian starts at the same q, Sigma_inv = U U^T + diag(d); the
  mean field at its diagonal, prec_diag = d + sum_j U_j^2. A non-zero U makes fast_sample and
  the truncation do real work (the paper's start U = 0 would hide errors there);
- the step's Info fields, in order, each as ``[line N (tag)] name shape`` and its values (in full
  up to SHOW_ALL entries, else the first SHOW_FIRST and the norm; inputs always in full).

``TAGS`` maps every Info field to the Algorithm 1 line and equation tag written in the trailing
comment of its NamedTuple field (tests/test_trace.py checks that the two agree).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_int
from refbayes.datasets import make_logistic_regression
from refbayes.experiments._io import atomic_write_text
from refbayes.linalg import lowrank
from refbayes.methods import ngvi, slang
from refbayes.methods._estimates import Batch, check_curvature
from refbayes.methods.driver import epoch_batches
from refbayes.models import LogisticRegression

__all__ = ["METHODS", "TAGS", "TraceInputs", "add_arguments", "format_trace", "format_values",
           "make_inputs", "run", "step", "tag_label", "to_json"]

METHODS = ("slang", "ngvi-full", "ngvi-meanfield")

# The shipped problem.
N_ROWS = 50
N_FEATURES = 5
PROBLEM_SEED = 0
SHOW_ALL = 200      # arrays up to this many entries are printed in full
SHOW_FIRST = 10     # entries shown of a larger array, with its norm

# Info field -> (Algorithm 1 line or None, equation tag), in the Info field order: the trailing
# comments of SLANGInfo, ngvi.FullInfo and ngvi.MeanFieldInfo, transcribed.
TAGS: dict[str, dict[str, tuple[str | None, str]]] = {
    "slang": {
        "alpha_t": (None, "(ngvi.12)"),
        "beta_t": ("2", "(ngvi.12)"),
        "theta": ("4", "(slang.2)"),
        "G": ("6", "(slang.3)"),
        "W": ("7", "(slang.4)"),
        "U": ("7, 9", "(slang.4)"),
        "Delta_d": ("8", "(slang.5)"),
        "d": ("10", "(slang.6)"),
        "g_tilde": ("11", "(slang.7)"),
        "direction": (None, "(ngvi.13)"),
        "Delta_mu": ("12", "(slang.8)"),
        "mu": ("13", "(slang.8)"),
    },
    "ngvi-full": {
        "alpha_t": (None, "(ngvi.12)"),
        "beta_t": (None, "(ngvi.12)"),
        "theta": (None, "(ngvi.4)"),
        "G": (None, "(ngvi.5)"),
        "g_hat": (None, "(ngvi.6) / (ngvi.9)"),
        "C_hat": (None, "(ngvi.7)-(ngvi.9)"),
        "Sigma_inv": (None, "(ngvi.10)"),
        "g_tilde": (None, "(ngvi.11)"),
        "direction": (None, "(ngvi.13)"),
        "Delta_mu": (None, "(ngvi.11)"),
        "mu": (None, "(ngvi.11)"),
    },
    "ngvi-meanfield": {
        "alpha_t": (None, "(ngvi.12)"),
        "beta_t": (None, "(ngvi.12)"),
        "theta": (None, "(ngvi.14)"),
        "G": (None, "(ngvi.5)"),
        "g_hat": (None, "(ngvi.6) / (ngvi.9)"),
        "c_hat": (None, "(ngvi.7)-(ngvi.9)"),
        "prec_diag": (None, "(ngvi.15)"),
        "g_tilde": (None, "(ngvi.16)"),
        "direction": (None, "(ngvi.13)"),
        "Delta_mu": (None, "(ngvi.16)"),
        "mu": (None, "(ngvi.16)"),
    },
}

STEPS = {"slang": slang.step, "ngvi-full": ngvi.step_full, "ngvi-meanfield": ngvi.step_meanfield}


class TraceInputs(NamedTuple):
    """Everything one traced step consumes, and how it was drawn."""
    method: str     # one of METHODS
    seed: int       # of numpy.random.default_rng, the only source of the draws
    L: int          # columns of the drawn U (SLANG's rank; the low-rank part of the ngvi start)
    model: Any      # LogisticRegression(N_FEATURES), D = N_FEATURES + 1
    X: np.ndarray   # (N, N_FEATURES) the shipped training set
    y: np.ndarray   # (N,) labels in {0, 1}
    idx: np.ndarray  # (M,) minibatch rows, rng.permutation(N)[:M]
    eps: Any        # (D, S) standard-normal draws, or None for curvature "exact"
    state: Any      # SLANGState | FullState | MeanFieldState
    cfg: Any        # SLANGConfig | NGVIConfig

    @property
    def batch(self) -> Batch:
        return Batch(self.X[self.idx], self.y[self.idx])


def _check_method(method) -> str:
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    return method


def make_inputs(method: str, *, seed: int = 0, M: int = 8, S: int = 1, L: int = 2,
                curvature: str | None = None, momentum: float = 0.0, t: int = 0) -> TraceInputs:
    """The problem, the starting state and the draws of one traced step (module docstring order).

    curvature: "ef" (default), "hess" or "exact" for the ngvi methods; SLANG is "ef" only.
    momentum: b of (ngvi.13); t: steps already taken (sets alpha_t, beta_t and the bias correction).
    """
    method = _check_method(method)
    seed = check_int(seed, "seed", low=0)
    N, D = N_ROWS, N_FEATURES + 1
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    L = check_int(L, "L", low=1, high=D)
    t = check_int(t, "t", low=0)
    curvature = check_curvature("ef" if curvature is None else curvature)
    if method == "slang" and curvature != "ef":
        raise ValueError("curvature: SLANG uses the empirical Fisher only ('ef'), "
                         f"got {curvature!r}")
    X, y, _ = make_logistic_regression(N, N_FEATURES, PROBLEM_SEED)
    model = LogisticRegression(N_FEATURES)
    lam = np.ones(D)

    rng = np.random.default_rng(seed)
    mu = 0.5 * rng.standard_normal(D)
    U = 0.5 * rng.standard_normal((D, L))
    d = rng.uniform(0.5, 1.5, D)
    g_bar = rng.standard_normal(D) if t > 0 else np.zeros(D)
    idx = epoch_batches(rng, N, M)[0]
    eps = None if curvature == "exact" else rng.standard_normal((D, S))

    if method == "slang":
        state = slang.init(mu, U, d)
        cfg = slang.SLANGConfig(N=N, lam=lam, L=L, momentum=momentum)
    elif method == "ngvi-full":
        state = ngvi.init_full(mu, lowrank.dense_precision(U, d))
        cfg = ngvi.NGVIConfig(N=N, lam=lam, curvature=curvature, momentum=momentum)
    else:
        state = ngvi.init_meanfield(mu, d + np.sum(U * U, axis=1))
        cfg = ngvi.NGVIConfig(N=N, lam=lam, curvature=curvature, momentum=momentum)
    state = state._replace(g_bar=g_bar, t=t)
    return TraceInputs(method, seed, L, model, X, y, idx, eps, state, cfg)


def step(inputs: TraceInputs):
    """(new state, Info) of the method's step on these inputs: a direct, deterministic call."""
    return STEPS[inputs.method](inputs.state, inputs.batch, inputs.eps, inputs.cfg, inputs.model)


# ----------------------------------------------------------------------------- printing

def tag_label(method: str, field: str) -> str:
    """'line 7 (slang.4)', 'lines 7, 9 (slang.4)' or '(ngvi.12)'."""
    line, tag = TAGS[method][field]
    if line is None:
        return tag
    return f"{'lines' if ',' in line else 'line'} {line} {tag}"


def _format_float(precision):
    return lambda v: f"{v: .{precision}e}"  # sign column keeps entries aligned


def format_values(a, precision: int, full: bool = False) -> str:
    """The values of a scalar or array: every entry when ``full`` or up to SHOW_ALL of them, else
    the first SHOW_FIRST (C order) and the Frobenius norm."""
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


def _draws_line(inputs: TraceInputs) -> str:
    D, L = inputs.state.mu.shape[0], inputs.L
    parts = [f"mu = 0.5 * rng.standard_normal({D})", f"U = 0.5 * rng.standard_normal(({D}, {L}))",
             f"d = rng.uniform(0.5, 1.5, {D})"]
    if inputs.state.t > 0:
        parts.append(f"g_bar = rng.standard_normal({D})")
    parts.append(f"idx = rng.permutation({inputs.X.shape[0]})[:{inputs.idx.shape[0]}]")
    if inputs.eps is not None:
        parts.append(f"eps = rng.standard_normal({inputs.eps.shape})")
    return f"rng = numpy.random.default_rng({inputs.seed}), in order: " + "; ".join(parts)


def _state_start(inputs: TraceInputs) -> str:
    if inputs.method == "slang":
        return "SLANGState(mu, U, d, g_bar, t)"
    if inputs.method == "ngvi-full":
        return "FullState(mu, Sigma_inv = U U^T + diag(d), g_bar, t)"
    return "MeanFieldState(mu, prec_diag = d + sum_j U_j^2, g_bar, t)"


def _cfg_text(cfg) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in cfg._asdict().items() if k != "lam")
    return f"{type(cfg).__name__}(lam=cfg.lam, {fields})"


def _inputs(inputs: TraceInputs) -> list[tuple[str, Any]]:
    """(name, value) of everything the step consumes, in the printed order."""
    batch = inputs.batch
    rows = [("idx", inputs.idx), ("batch.X", batch.X), ("batch.y", batch.y)]
    if inputs.eps is not None:
        rows.append(("eps", inputs.eps))
    rows += [(f"state.{k}", v) for k, v in inputs.state._asdict().items() if k != "t"]
    rows.append(("cfg.lam", inputs.cfg.lam))
    return rows


def format_trace(inputs: TraceInputs, info, precision: int = 8) -> str:
    """The printed trace: header, inputs and draws, then one block per Info field, in order."""
    method, state = inputs.method, inputs.state
    fn = STEPS[method]
    lines = [
        f"refbayes trace {method}: one step of {fn.__module__}.{fn.__name__}",
        (f"problem: make_logistic_regression(n={N_ROWS}, p={N_FEATURES}, seed={PROBLEM_SEED}) "
         f"-> X {inputs.X.shape}, y {inputs.y.shape}; {inputs.model!r} (intercept last); "
         f"D = {state.mu.shape[0]}, N = {inputs.X.shape[0]}"),
        f"config: {_cfg_text(inputs.cfg)}",
        f"start: {_state_start(inputs)} with t = {state.t}",
        f"draws: {_draws_line(inputs)}",
        "",
    ]
    if inputs.eps is None:
        lines += ["[input] eps: none (curvature 'exact' takes expectations by quadrature)", ""]
    for name, value in _inputs(inputs):  # in full, whatever their size: they are to be fed back
        lines += [_block("input", name, value, precision, full=True), ""]
    lines.append(f"{type(info).__name__}, in order:")
    for field, value in info._asdict().items():
        lines += [_block(tag_label(method, field), field, value, precision), ""]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- JSON

def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return v


def to_json(inputs: TraceInputs, info) -> dict:
    """Inputs, draws and every Info field as nested lists (floats round-trip exactly)."""
    cfg = {k: _jsonable(v) for k, v in inputs.cfg._asdict().items()}
    return {
        "method": inputs.method,
        "seed": inputs.seed,
        "problem": {"generator": "refbayes.datasets.make_logistic_regression",
                    "n": N_ROWS, "p": N_FEATURES, "seed": PROBLEM_SEED, "intercept": "last",
                    "X": inputs.X.tolist(), "y": inputs.y.tolist()},
        "config": cfg,
        "draws": {"idx": inputs.idx.tolist(),
                  "eps": None if inputs.eps is None else inputs.eps.tolist()},
        "state": {k: _jsonable(v) for k, v in inputs.state._asdict().items()},
        "info": {field: {"line": TAGS[inputs.method][field][0],
                         "tag": TAGS[inputs.method][field][1],
                         "shape": list(np.shape(value)),
                         "value": _jsonable(value)}
                 for field, value in info._asdict().items()},
    }


# ----------------------------------------------------------------------------- command line

def add_arguments(parser) -> None:
    parser.add_argument("method", metavar="METHOD", help=f"one of {', '.join(METHODS)}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    parser.add_argument("--M", type=int, default=8, help="minibatch rows (default 8)")
    parser.add_argument("--S", type=int, default=1, help="Monte Carlo draws (default 1)")
    parser.add_argument("--L", type=int, default=2,
                        help="rank of U: SLANG's rank, and the low-rank part of the starting "
                             "precision for ngvi (default 2)")
    parser.add_argument("--curvature", default=None,
                        help="ngvi curvature: ef (default), hess or exact")
    parser.add_argument("--momentum", type=float, default=0.0, help="b of (ngvi.13) (default 0)")
    parser.add_argument("--t", type=int, default=0,
                        help="steps already taken (default 0; momentum shows from t > 0)")
    parser.add_argument("--precision", type=int, default=8,
                        help="digits after the point (default 8; 16 round-trips float64)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the inputs, draws and every intermediate as JSON")


def _json_folder(path: Path) -> None:
    """Make ``path``'s folder ready: create it when its own parent exists, never more.

    A mistyped ``--json /nonexistent/dir/x.json`` is an error naming the path, not a tree of
    folders created from the filesystem root.
    """
    parent = path.parent
    if parent.is_dir():
        return
    for folder in (parent, parent.parent):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"--json: cannot write {path}: {folder} is not a folder")
    if not parent.parent.is_dir():
        raise ValueError(f"--json: cannot write {path}: the folder {parent.parent} does not exist "
                         "(only the file's own folder is created)")
    parent.mkdir()


def run(args) -> int:
    """The ``refbayes trace`` handler: print the trace to stdout, optionally write the JSON."""
    precision = check_int(args.precision, "precision", low=0, high=17)
    if args.json is not None:
        _json_folder(Path(args.json))
    inputs = make_inputs(args.method, seed=args.seed, M=args.M, S=args.S, L=args.L,
                         curvature=args.curvature, momentum=args.momentum, t=args.t)
    _, info = step(inputs)
    print(format_trace(inputs, info, precision), end="")
    if args.json is not None:
        path = atomic_write_text(args.json, json.dumps(to_json(inputs, info), indent=1) + "\n")
        print(f"json: {path}")
    return 0
