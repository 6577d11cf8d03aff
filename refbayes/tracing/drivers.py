"""Traces of the driven methods (vogn, ogn, vadam, vprop, noisy-adam, bbb, mc-dropout, adam,
slang-mlp), read off their method records: K chained driver steps on the shipped MLP problem,
or on the tiny CNN (``model="tiny-cnn"``, ``refbayes trace METHOD --model tiny-cnn``).

Each ``TraceStart`` of ``refbayes.methods.records`` is one trace: the mean ``mu`` is drawn
first, then the record's start draws the rest of the state, then every step draws its minibatch
and the record's ``draws`` (``derivations/tracing.md``). A method added with a record that
names a trace start is traced with no change here.
"""
from __future__ import annotations

import numpy as np

from refbayes._checks import check_int
from refbayes.methods.records import RECORDS
from refbayes.tracing.chain import Chain, run_chain
from refbayes.tracing.problems import MEAN_SCALE, MODELS, N_ROWS, mlp_problem, problem_of
from refbayes.tracing.tracer import Tracer, register

__all__ = ["check_driven_options", "driver_chain", "register_record_traces"]

OVERSAMPLE = 10  # the driver's default oversampling of SLANG's randomized fast_eig


def driver_chain(record, start, seed: int, model: str | None = None, **options) -> Chain:
    """Build the chain of one trace start: its state and config, the record's step and draws.

    Parameters
    ----------
    record : Record
        The method's record.
    start : TraceStart
        One of ``record.traces``.
    seed : int
        Seed of ``numpy.random.default_rng``, the only source of the draws.
    model : str or None, default None
        None: the shipped MLP problem (``problems.mlp_problem``); "tiny-cnn": the tiny-CNN
        problem (``problems.cnn_problem``), the draws the same recipe with its D = 47.
    **options
        The trace's options: M, S where it is one (else ``start.S``), and the start's own.

    Returns
    -------
    Chain
        The start drawn (mu first, then the record's start), ready for ``run_chain``.

    Raises
    ------
    ValueError
        If M or S is outside its range (``check_driven_options``), a start option is, or model
        is not one of ``problems.MODELS``.
    """
    M, S = check_driven_options(record, start, options.pop("M"), options.pop("S", start.S))
    net, X, y = problem_of(model, mlp_problem)
    rng = np.random.default_rng(seed)
    mu = MEAN_SCALE * rng.standard_normal(net.D)
    state, cfg = start.start(mu, rng, X.shape[0], **options)

    def draws(rng, M):
        return record.draws(rng, cfg, net, M, S, OVERSAMPLE, np.float64, np)

    return Chain(state, cfg, net, X, y, M, record.step, draws, rng)


def check_driven_options(record, start, M, S) -> tuple:
    """Check a driven trace's M and S before anything is drawn: no clamp, no reinterpretation.

    Parameters
    ----------
    record : Record
        The method's record.
    start : TraceStart
        One of ``record.traces``.
    M : int
        Minibatch rows, in [1, N] (N = ``N_ROWS``, the shipped problem's rows).
    S : int
        Draws per step: >= 1 where S is the trace's option; ``start.S`` where it is not (ogn: 0).

    Returns
    -------
    tuple of int
        (M, S).

    Raises
    ------
    ValueError
        If M is outside [1, N] (the driver's minibatches would cut it to N, or fail deep inside
        for M < 1), or the option S is < 1: S = 0 of a record that allows it (vogn) is traced
        as its own method (ogn), which the message names.
    """
    M = check_int(M, "M")
    if not 1 <= M <= N_ROWS:
        raise ValueError(f"M: expected an integer in [1, {N_ROWS}] (the rows of the shipped "
                         f"problem), got {M}")
    if "S" not in start.options:
        return M, S
    check_int(S, "S")
    if S < 1:
        zero = [t.name for t in record.traces if "S" not in t.options and t.S == 0]
        where, hint = "", ""
        if record.zero_samples:
            where = f" for {start.name}"
            if S == 0 and zero:
                hint = f" (S = 0 is traced as `refbayes trace {zero[0]}`)"
        raise ValueError(f"S: expected an integer in [1, inf){where}, got {S}{hint}")
    return M, S


def _run(record, start):
    def run(seed, steps, dtype, **options):
        return run_chain(driver_chain(record, start, seed, **options), seed, steps, dtype)
    return run


def register_record_traces(records=RECORDS) -> None:
    """Register a tracer for every trace start of every record.

    Parameters
    ----------
    records : dict of str to Record, default ``refbayes.methods.records.RECORDS``
        The records whose trace starts to register.
    """
    for record in records.values():
        for start in record.traces:
            register(Tracer(start.name, record.note, _run(record, start), dict(start.options),
                            sign_free=start.sign_free, models=MODELS))


register_record_traces()
