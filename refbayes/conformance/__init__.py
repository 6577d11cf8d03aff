"""Conformance: run a public library and refbayes on identical inputs and classify every difference.

``refbayes conformance NAME`` runs one report of ``REPORTS``: the public implementation (PyTorch)
and refbayes are fed the same problem, the same MAP or start, the same minibatches and the same
standard-normal draws, and each compared quantity becomes one ``Row``:

- ``agree``: max rel error (``refbayes._tolerances.rel_err``, max|a - b| / max|b|) within
  ``EXACT_F64`` = 1e-10, everything in float64 on both sides;
- ``convention``: the raw comparison differs, and after the mapping of a conventions table
  (derivations/<method>.md, "Conventions of public implementations") it agrees to EXACT_F64; the
  row shows both errors, raw -> mapped, and the note names the mapping;
- ``defect``: no documented mapping explains the difference; the note says which side is wrong
  and the dense check (an independent dense autograd computation, or refbayes' dense
  ``model.ggn`` / ``model.hessian``) that decides it.

Importing this package does not import torch; a report imports torch and its library when it
runs, and ``run`` raises a ValueError naming ``pip install "refbayes[conformance]"`` when either
is missing.  The exit status of ``run`` is 0 without a defect row, 1 otherwise.
"""
from __future__ import annotations

import importlib
import itertools
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from refbayes._files import atomic_write_text, format_table
from refbayes._tolerances import EXACT_F64, rel_err

__all__ = ["REPORTS", "TOLERANCE", "VERDICTS", "Report", "ReportSpec", "Row", "add_arguments",
           "classify", "format_report", "get_report", "run"]

TOLERANCE = EXACT_F64  # float64 on both sides: an exact identity evaluated two ways
VERDICTS = ("agree", "convention", "defect")
INSTALL_HINT = 'pip install "refbayes[conformance]"'


class Row(NamedTuple):
    """One compared quantity of a conformance report.

    Attributes
    ----------
    quantity : str
        What is compared (a structure, a step, an equation tag).
    error : float
        Max relative error max|refbayes - library| / max|library| after the mapping (the raw
        error when no mapping applies).
    raw_error : float or None
        The error before the mapping of a conventions table; None when none was applied.
    verdict : str
        "agree", "convention" or "defect".
    note : str
        For a convention: the mapping that explains it; for a defect: the wrong side and the
        dense check that decides it.
    """
    quantity: str
    error: float
    raw_error: Any
    verdict: str
    note: str


class Report(NamedTuple):
    """The result of one conformance run.

    Attributes
    ----------
    name : str
        The report's name in REPORTS.
    title : str
        One line: the library, versions and problem.
    rows : list of Row
        The compared quantities, in the order run.
    """
    name: str
    title: str
    rows: list

    @property
    def defects(self) -> list:
        """The rows whose verdict is "defect"."""
        return [r for r in self.rows if r.verdict == "defect"]


class ReportSpec(NamedTuple):
    """A registered report: where it lives and what it needs.

    Attributes
    ----------
    module : str
        Module with a ``report()`` function returning a Report.
    requires : tuple of str
        Importable modules it needs besides refbayes (torch and the library).
    description : str
        One line for ``--list``.
    """
    module: str
    requires: tuple
    description: str


REPORTS = {
    "laplace-torch": ReportSpec(
        "refbayes.conformance.laplace_torch", ("torch", "laplace"),
        "laplace-torch's Laplace (full, diag, kron; all weights and last layer; GGN, EF, "
        "Hessian; regression and classification with the probit and MC links; temperature, "
        "K-FAC damping and generator=) vs refbayes.methods.laplace and dense float64 "
        "computations"),
    "ivon": ReportSpec(
        "refbayes.conformance.ivon", ("torch", "ivon"),
        "ivon-opt's IVON optimizer vs the NumPy IVON reference step, and its reduction to "
        "refbayes.methods.vogn, same minibatches and draws"),
    "backpack": ReportSpec(
        "refbayes.conformance.backpack", ("torch", "backpack"),
        "BackPACK's BatchGrad, SumGradSquared, BatchL2Grad, DiagGGNExact, KFLR and KFAC "
        "(1 MC label) vs refbayes' CNN on tiny_cnn and LeNet-5, float64"),
    "curvlinops": ReportSpec(
        "refbayes.conformance.curvlinops", ("torch", "curvlinops"),
        "curvlinops' KFACLinearOperator (expand, reduce; sum and mean reduction; joint and "
        "separate bias), GGNLinearOperator and HessianLinearOperator vs refbayes' CNN on "
        "tiny_cnn and LeNet-5, float64"),
}


def classify(quantity: str, error: float, *, raw_error=None, note: str = "",
             decide=None) -> Row:
    """Classify one comparison as agree, convention or defect.

    Parameters
    ----------
    quantity : str
        What is compared.
    error : float
        Max relative error after the mapping (or the raw error when raw_error is None).
    raw_error : float or None, default None
        Max relative error before the mapping of a conventions table.
    note : str, default ""
        The mapping (for a convention) or context.
    decide : callable or None, default None
        Called without arguments when the error exceeds TOLERANCE; returns the note of the
        defect (which side, the dense check).  None: the defect note says that no dense check
        decides it.

    Returns
    -------
    Row
        The classified row.
    """
    error = float(error)
    raw = None if raw_error is None else float(raw_error)
    if error <= TOLERANCE:
        verdict = "convention" if raw is not None and not raw <= TOLERANCE else "agree"
        return Row(quantity, error, raw, verdict, note if verdict == "convention" or note else "")
    reason = decide() if decide is not None else "no dense check available: side undecided"
    return Row(quantity, error, raw, "defect", f"{reason}" + (f"; {note}" if note else ""))


def dense_side(ours, theirs, dense, what: str) -> str:
    """Name the side of a defect from both sides' distance to a dense reference.

    Parameters
    ----------
    ours : array_like
        The refbayes value.
    theirs : array_like
        The library's value.
    dense : array_like
        The dense check's value.
    what : str
        The dense check, in words.

    Returns
    -------
    str
        "<side> wrong: <what>: refbayes e1, library e2" with the relative errors to the dense
        check.
    """
    e_ours, e_theirs = rel_err(ours, dense), rel_err(theirs, dense)
    if e_ours <= TOLERANCE < e_theirs:
        side = "library"
    elif e_theirs <= TOLERANCE < e_ours:
        side = "refbayes"
    else:
        side = "both sides" if e_ours > TOLERANCE else "undecided"
    return f"{side} wrong by {what}: refbayes {e_ours:.1e}, library {e_theirs:.1e} from it"


def _cell(row: Row) -> str:
    if row.raw_error is None:
        return f"{row.error:.1e}"
    return f"{row.raw_error:.1e} -> {row.error:.1e}"


def format_report(report: Report) -> str:
    """Format a report as its title line and the plain-text table.

    Parameters
    ----------
    report : Report
        A report from ``get_report(name).report()``.

    Returns
    -------
    str
        Title, table (quantity, max rel error, verdict, note) and a one-line summary.
    """
    rows = [[r.quantity, _cell(r), r.verdict, r.note] for r in report.rows]
    counts = {v: sum(r.verdict == v for r in report.rows) for v in VERDICTS}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items())
    return "\n".join([report.title,
                      (f"max rel error = max|refbayes - library| / max|library| (refbayes: "
                       f"the dense value where refbayes has no counterpart); raw -> mapped "
                       f"for conventions; tolerance {TOLERANCE:g}"),
                      format_table(["quantity", "max rel error", "verdict", "note"], rows),
                      f"{len(report.rows)} rows: {summary}"])


def get_report(name: str):
    """Import the module of a registered report, checking its requirements first.

    Parameters
    ----------
    name : str
        A key of REPORTS.

    Returns
    -------
    module
        The report module (its ``report()`` returns a Report).

    Raises
    ------
    ValueError
        If name is not registered, or torch or the library cannot be imported (the message
        names ``pip install "refbayes[conformance]"``).
    """
    if name not in REPORTS:
        raise ValueError(f"NAME: expected one of {', '.join(REPORTS)}, got {name!r}")
    spec = REPORTS[name]
    for mod in spec.requires:
        try:
            importlib.import_module(mod)
        except ImportError as err:
            raise ValueError(f"conformance {name} needs {mod!r}, which could not be imported "
                             f"({err}); install it with: {INSTALL_HINT}") from None
    return importlib.import_module(spec.module)


def add_arguments(parser) -> None:
    """Add the arguments of ``refbayes conformance`` to an argparse parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The ``conformance`` subcommand's parser.
    """
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help=f"the report: {', '.join(REPORTS)}")
    parser.add_argument("--list", action="store_true", help="list the reports and exit")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the rows (quantity, error, raw_error, verdict, note) "
                             "as JSON")


def _jsonable(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def run(args) -> int:
    """Run ``refbayes conformance``: list the reports, or run one and print its table.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments: name, list, json.

    Returns
    -------
    int
        0 when no row is a defect (or with --list), 1 otherwise.

    Raises
    ------
    ValueError
        If no NAME is given without --list, NAME is unknown, or torch or the library is
        missing.
    """
    if args.list:
        print(format_table(["name", "needs", "compares"],
                           [[n, ", ".join(s.requires), s.description] for n, s in REPORTS.items()]))
        return 0
    if args.name is None:
        raise ValueError(f"NAME: expected one of {', '.join(REPORTS)} (or --list), got none")
    report = get_report(args.name).report()
    print(format_report(report))
    if args.json:
        payload = {"name": report.name, "title": report.title, "tolerance": TOLERANCE,
                   "rows": [{"quantity": r.quantity, "error": _jsonable(r.error),
                             "raw_error": _jsonable(r.raw_error), "verdict": r.verdict,
                             "note": r.note} for r in report.rows]}
        atomic_write_text(Path(args.json), json.dumps(payload, indent=1) + "\n")
    return 1 if report.defects else 0


# ----------------------------------------------------------------------------- torch helpers

def torch_order(sizes) -> np.ndarray:
    """Return perm with theta[perm] in PyTorch's parameter order for an MLP of these sizes.

    refbayes stores layer l as W_l (n_in, n_out) row-major, then b_l; ``nn.Linear`` stores
    weight (n_out, n_in) row-major, then bias, so the weight block is transposed.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths [n_0, ..., n_L].

    Returns
    -------
    numpy.ndarray of shape (D,)
        Index array: refbayes theta[perm] is the flat torch parameter vector.
    """
    perm, off = [], 0
    for n_in, n_out in itertools.pairwise(sizes):
        W = np.arange(off, off + n_in * n_out).reshape(n_in, n_out)
        perm += list(W.T.reshape(-1)) + list(range(off + n_in * n_out, off + (n_in + 1) * n_out))
        off += (n_in + 1) * n_out
    return np.array(perm, dtype=np.int64)


def torch_mlp(model, theta):
    """Build the float64 ``nn.Sequential`` of Linear / activation layers holding theta.

    Parameters
    ----------
    model : refbayes.models.MLP
        The refbayes network (its sizes and activation, "tanh" or "relu").
    theta : numpy.ndarray of shape (D,)
        Parameters in refbayes' order.

    Returns
    -------
    torch.nn.Sequential
        The same function of x in PyTorch, float64.
    """
    import torch
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[model.activation]
    layers = []
    for l, (W, b) in enumerate(model.unflatten(theta)):
        lin = torch.nn.Linear(*W.shape, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T)))
            lin.bias.copy_(torch.from_numpy(np.array(b)))
        layers.append(lin)
        if l < len(model.sizes) - 2:
            layers.append(act())
    return torch.nn.Sequential(*layers)


def flat_params(net) -> np.ndarray:
    """Return the parameters of a torch module as one float64 NumPy vector, torch order.

    Parameters
    ----------
    net : torch.nn.Module
        The module.

    Returns
    -------
    numpy.ndarray of shape (D,)
        Concatenated ``p.detach().reshape(-1)`` over ``net.parameters()``.
    """
    return np.concatenate([p.detach().reshape(-1).numpy() for p in net.parameters()])
