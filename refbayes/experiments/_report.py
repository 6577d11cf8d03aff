"""What an experiment's tables and figures say about the run behind them: its budget, whether
it is comparable with the paper's figures, and whether its optimisation converged.

Three rules every ``refbayes reproduce`` table and figure follows (issue 35, item 6):

1. **The budget is in the title.** Every table header and figure title states the Monte Carlo
   samples S and the budget actually used (epochs / steps / iterations, data size), so a number
   is never read without the budget that produced it.
2. **A reduced budget is marked where the paper's figures stand.** Where a table prints a
   paper's (or another published source's) figures beside ours, a run below that source's
   budget (``--quick``, fewer epochs, fewer samples, a subset of the data) prints
   :func:`caveat` as a line of the table, directly above the rows, naming what was reduced. The
   paper's column is kept, not dropped: one table shape for every budget (scripts and tests
   read it), and the target stays in view; the caveat says the two are not to be compared.
3. **An unconverged optimisation is flagged.** Each experiment states its criterion (below);
   a run that fails it gets a ``"convergence"`` record in its JSON (:func:`plateau` or the
   experiment's own), a ``not converged: ...`` line under its table, and ``(not converged)``
   after its name in figure legends (:func:`legend`).

The criterion for a training curve (:func:`plateau`): the objective's change over the last
``WINDOW`` (10%) of the budget, from the last recorded point at or before 90% of the budget to
the end, is within ``rtol`` of its final value, plus ``atol`` for objectives that converge to 0
(a KL to the exact posterior). When the curve has no point exactly at 90% the window is longer
than 10% (the criterion is then stricter), and the window actually used is recorded.
"""
from __future__ import annotations

import math

__all__ = ["WINDOW", "caveat", "legend", "not_converged", "plateau"]

WINDOW = 0.1  # the last fraction of the budget whose change decides convergence


def plateau(points, budget: int, what: str, rtol: float, atol: float = 0.0,
            unit: str = "steps") -> dict:
    """Did a training curve level off over the last ``WINDOW`` of its budget?

    ``points``: [(step, value)] in increasing step, the last at the end of the run (``budget``).
    Converged when |f(end) - f(start)| <= rtol |f(end)| + atol, start the last point at or
    before (1 - WINDOW) budget. Returns the JSON record ``{"converged", "criterion", "what",
    "start", "end", "value_start", "value_end", "relative_change", "rtol", "atol"}``;
    ``converged`` is None (not assessed) when the curve does not reach the end of the budget
    or has no point before the window, or a value is not finite.
    """
    crit = (f"|change of {what}| over the last {WINDOW:.0%} of {budget} {unit} <= "
            f"{rtol:g} x |final value|" + (f" + {atol:g}" if atol else ""))
    rec = {"converged": None, "criterion": crit, "what": what, "rtol": rtol, "atol": atol,
           "start": None, "end": None, "value_start": None, "value_end": None,
           "relative_change": None}
    pts = [(int(s), float(v)) for s, v in points]
    if not pts or pts[-1][0] != budget:
        return rec
    before = [p for p in pts if p[0] <= (1 - WINDOW) * budget]
    if not before:
        return rec
    (s0, v0), (s1, v1) = before[-1], pts[-1]
    if not (math.isfinite(v0) and math.isfinite(v1)):
        return rec
    change = abs(v1 - v0)
    rec.update(start=s0, end=s1, value_start=v0, value_end=v1,
               relative_change=change / abs(v1) if v1 != 0 else math.inf,
               converged=bool(change <= rtol * abs(v1) + atol))
    return rec


def not_converged(rec: dict | None, name: str = "") -> str:
    """The table line for a record that failed its criterion ('' when converged or not
    assessed), e.g. 'not converged: slang-1: sym KL changed 12.3% over steps 180-200 ...'."""
    if not rec or rec.get("converged") is not False:
        return ""
    if rec.get("relative_change") is None:  # an experiment's own record: its reason
        return f"not converged: {name + ': ' if name else ''}{rec.get('reason', rec['criterion'])}"
    return (f"not converged: {name + ': ' if name else ''}{rec['what']} went "
            f"{rec['value_start']:.4g} -> {rec['value_end']:.4g} "
            f"({100 * rec['relative_change']:.1f}%) from {rec['start']} to {rec['end']}; "
            f"criterion: {rec['criterion']}")


def legend(label: str, rec: dict | None) -> str:
    """A figure legend entry: ``label``, with ' (not converged)' when ``rec`` failed."""
    return label + (" (not converged)" if rec and rec.get("converged") is False else "")


def caveat(run: str, reference: str, reduced: list, kind: str = "") -> str:
    """The line a table with a paper's figures prints for a run below the paper's budget:
    '<kind> run: <run>; not comparable to <reference> (<reduced>)'; '' when nothing is reduced.

    ``run`` states this run's budget (S, steps, data); ``reduced`` names what is below the
    reference's (e.g. ['600 of 10000 steps', 'the 5k subset, not full MNIST'])."""
    if not reduced:
        return ""
    kind = kind or "reduced-budget"
    return (f"CAVEAT - {kind} run: {run}; not comparable to {reference} "
            f"({'; '.join(reduced)})")
