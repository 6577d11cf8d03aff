"""The contract every iterative method keeps, written down once, and the record that describes one.

A method is a module of ``refbayes.methods`` with

- ``XState(NamedTuple)``: one field per state symbol, each field's trailing comment giving its
  symbol, shape and equation tag (``refbayes.tracing.tags.field_tags`` reads the tags there);
- ``XConfig(NamedTuple)``: the hyperparameters, the paper's defaults, the validity rules stated
  once in its docstring;
- ``init(...) -> XState``;
- ``step(state, batch, noise, cfg, model, **kwargs) -> (XState, XInfo)``: a pure function. It
  draws nothing: ``batch`` is the minibatch (``Batch(X_B, y_B)``), ``noise`` every random number
  the step consumes (standard-normal ``eps`` (D, S), dropout masks, or None), and ``kwargs`` any
  further draws (SLANG's ``Omega``). Fed the same arguments, another implementation must take
  the same step;
- ``XInfo(NamedTuple)``: every named intermediate of the step, in the order the step computes
  them, each field's comment tagged with its equation.

The draws of one step are made by a ``draws`` function of the method's record, in float64 from
the caller's ``numpy.random.Generator`` (the order is part of the contract: the driver draws the
minibatch first, then calls it):

``draws(rng, cfg, model, M, S, oversample, dtype, xp) -> (noise, kwargs)``

A ``Record`` names all of it, so the driver (``refbayes.methods.driver``), the tracing package
(``refbayes.tracing``) and the experiments read one table (``refbayes.methods.records``): adding a
method is its module and its record.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Record", "TraceStart"]


class TraceStart(NamedTuple):
    """How the golden trace of a driven method starts, on the shipped MLP problem.

    ``refbayes.tracing`` draws ``mu = 0.5 * rng.standard_normal(D)`` first, then calls
    ``start(mu, rng, N, **options) -> (state, cfg)`` (further start draws come from the same
    ``rng``), then takes chained steps with the record's ``draws``.
    """
    name: str                # the trace's name on the command line: refbayes trace NAME
    start: Callable          # start(mu, rng, N, **options) -> (state, cfg)
    options: dict            # the trace's options and their defaults (refbayes trace flags)
    sign_free: tuple = ()    # outputs whose columns are eigenvectors, compared up to sign
    S: int = 2               # draws per step where "S" is not an option (ogn: 0)


class Record(NamedTuple):
    """One method: its types, its step, how a step draws, where it is derived, how it is traced."""
    name: str                # the method's name, e.g. "vogn"
    state: type              # the State class
    config: type             # the Config class
    step: Callable           # step(state, batch, noise, cfg, model, **kwargs) -> (state, info)
    draws: Callable          # (rng, cfg, model, M, S, oversample, dtype, xp) -> (noise, kwargs)
    note: str                # its derivation note, e.g. "derivations/vogn.md"
    zero_samples: bool = False  # S = 0 is allowed (vogn: OGN, gradient and curvature at the mean)
    traces: tuple = ()       # TraceStart of each golden trace run through the driver
