"""Traces of the driven methods (vogn, ogn, vadam, vprop, noisy-adam, bbb, mc-dropout, adam,
slang-mlp), read off their method records: K chained driver steps on the shipped MLP problem.

Each ``TraceStart`` of ``refbayes.methods.records`` is one trace: the mean ``mu`` is drawn
first, then the record's start draws the rest of the state, then every step draws its minibatch
and the record's ``draws`` (``derivations/tracing.md``). A method added with a record that
names a trace start is traced with no change here.
"""
from __future__ import annotations

import numpy as np

from refbayes.methods.records import RECORDS
from refbayes.tracing.chain import Chain, run_chain
from refbayes.tracing.problems import MEAN_SCALE, N_ROWS, mlp_problem
from refbayes.tracing.tracer import Tracer, register

__all__ = ["driver_chain", "register_record_traces"]

OVERSAMPLE = 10  # the driver's default oversampling of SLANG's randomized fast_eig


def driver_chain(record, start, seed: int, **options) -> Chain:
    """Build the chain of one trace start: its state and config, the record's step and draws.

    Parameters
    ----------
    record : Record
        The method's record.
    start : TraceStart
        One of ``record.traces``.
    seed : int
        Seed of ``numpy.random.default_rng``, the only source of the draws.
    **options
        The trace's options: M, S where it is one (else ``start.S``), and the start's own.

    Returns
    -------
    Chain
        The start drawn (mu first, then the record's start), ready for ``run_chain``.
    """
    model, X, y = mlp_problem()
    rng = np.random.default_rng(seed)
    mu = MEAN_SCALE * rng.standard_normal(model.D)
    M = options.pop("M")
    S = options.pop("S", start.S)
    state, cfg = start.start(mu, rng, N_ROWS, **options)

    def draws(rng, M):
        return record.draws(rng, cfg, model, M, S, OVERSAMPLE, np.float64, np)

    return Chain(state, cfg, model, X, y, M, record.step, draws, rng)


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
                            sign_free=start.sign_free))


register_record_traces()
