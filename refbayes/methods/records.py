"""The method records: one per iteratively driven method (``_protocol.Record``), read by the
driver, by ``refbayes.tracing`` (the golden traces of the driven methods) and by the experiments.

Each record's ``draws`` makes one step's random numbers after its minibatch, in float64 from the
caller's generator, cast to the state's dtype (the order is ``refbayes.methods.driver``'s
module docstring):

- ngvi (full, mean field), vogn, vadam, noisy_adam, bbb, ktied:
  ``eps = rng.standard_normal((D, S))``
  (none for ngvi's curvature "exact", none for vogn with S = 0, which is OGN);
- slang: eps as above, then with eig "randomized" ``Omega = rng.standard_normal((L + M S,
  L + oversample))``;
- mc_dropout: one mask per layer input, in layer order, ``rng.random((M, n_k)) >= p``;
- adam (MAP) and swag's SGD: nothing.

The traces' starts (``TraceStart``) draw after the mean ``mu``, from the same generator; the
shipped problem is ``refbayes.tracing.problems.mlp_problem``.

Examples
--------
The record of a (state, cfg) pair names the method's step, its derivation note and how one step
draws; ``driver.run`` and the tracer call the record's ``draws`` with their Generator:

>>> import numpy as np
>>> from refbayes.methods import records, vogn
>>> from refbayes.models import LogisticRegression
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> cfg = vogn.VOGNConfig(N=20, delta=1.0)
>>> rec = records.record_of(vogn.init(np.zeros(model.D), np.ones(model.D)), cfg)
>>> rec.name, rec.note, rec.step is vogn.step
('vogn', 'derivations/vogn.md', True)
>>> noise, kwargs = rec.draws(np.random.default_rng(0), cfg, model, 8, 2, 10, np.float64, np)
>>> noise.shape, kwargs                           # eps (D, S), no further draws
((4, 2), {})
"""
from __future__ import annotations

import numpy as np

from refbayes._checks import check_in_range, check_int
from refbayes.methods import (adam, bbb, ktied, mc_dropout, ngvi, noisy_adam, slang, swag, vadam,
                              vogn)
from refbayes.methods._protocol import Record, TraceStart
from refbayes.models.dropout import mask_shapes

__all__ = ["RECORDS", "get_record", "record_of"]  # draw_masks is public as driver.draw_masks


def draw_masks(rng: np.random.Generator, model, M: int, p: float, dtype=np.float64,
               sites=None) -> list:
    """Draw MC dropout masks z_k ~ Bernoulli(1 - p), one per mask site.

    The sites default to the inputs of the layers with parameters. Drawn site by site as
    rng.random((M,) + shape_k) >= p, NumPy arrays in ``dtype``, with shape_k =
    ``refbayes.models.dropout.mask_shapes(model, sites)[k]`` ((n_k,) for an MLP, the (C, H, W)
    input of a CNN's Conv2d).

    Parameters
    ----------
    rng : numpy.random.Generator
        Generator owned by the caller.
    model : FlatModel or CNN
        The network.
    M : int
        Number of rows, >= 1.
    p : float
        Drop probability in [0, 1).
    dtype : numpy dtype, default numpy.float64
        Dtype of the masks.
    sites : tuple of int, optional
        A CNN's mask sites (``refbayes.models.dropout.output_sites``: torch's placement); None:
        the inputs of the layers with parameters.

    Returns
    -------
    list of numpy.ndarray
        [z_0 (M,) + shape_0, ..., z_{J-1} (M,) + shape_{J-1}], entries 0 or 1.

    Raises
    ------
    ValueError
        If rng is not a numpy.random.Generator, M is not an integer >= 1, p is not a real
        number in [0, 1), or sites is invalid for model.
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    check_int(M, "M", low=1)
    check_in_range(p, "p", 0.0, 1.0, high_open=True)
    return [(rng.random((M,) + shape) >= p).astype(dtype) for shape in mask_shapes(model, sites)]


# ----------------------------------------------------------------------------- draws of one step

def _eps(rng, D, S, dtype, xp):
    return xp.asarray(rng.standard_normal((D, S)), dtype=dtype)


def gaussian_draws(rng, cfg, model, M, S, oversample, dtype, xp):
    return _eps(rng, model.D, S, dtype, xp), {}


def ngvi_draws(rng, cfg, model, M, S, oversample, dtype, xp):
    return (None if cfg.curvature == "exact" else _eps(rng, model.D, S, dtype, xp)), {}


def slang_draws(rng, cfg, model, M, S, oversample, dtype, xp):
    eps = _eps(rng, model.D, S, dtype, xp)
    if cfg.eig != "randomized":
        return eps, {}
    Omega = rng.standard_normal((cfg.L + M * S, cfg.L + oversample))
    return eps, {"Omega": xp.asarray(Omega, dtype=dtype)}


def vogn_draws(rng, cfg, model, M, S, oversample, dtype, xp):
    return (None if S == 0 else _eps(rng, model.D, S, dtype, xp)), {}


def mask_draws(rng, cfg, model, M, S, oversample, dtype, xp):
    return [xp.asarray(z) for z in draw_masks(rng, model, M, cfg.p, dtype, cfg.sites)], {}


def no_draws(rng, cfg, model, M, S, oversample, dtype, xp):
    return None, {}


def map_step(state, batch, noise, cfg, model):
    """Adam on the MAP objective in the step contract's form (adam.step takes N and lam)."""
    # errors name cfg.lam, cfg.adam.alpha, ... (adam.step would name its own lam, cfg.alpha)
    D = adam.check_theta_state(state, adam.MAPState)
    adam.check_map_config(cfg, D, state.theta.dtype)
    return adam.step(state, batch, cfg.adam, model, cfg.N, cfg.lam)


# ----------------------------------------------------------------------------- trace starts
# start(mu, rng, N, **options) -> (state, cfg): the draws after mu, then the config

def _vogn_start(mu, rng, N, curvature="ef"):
    s = rng.uniform(0.5, 1.5, mu.shape[0])
    return vogn.init(mu, s), vogn.VOGNConfig(N, delta=1.0, alpha=0.1, curvature=curvature)


def _slang_start(mu, rng, N, L=3):
    D = mu.shape[0]
    L = check_int(L, "L", low=1, high=D)  # before U's draw is shaped by it
    U = 0.5 * rng.standard_normal((D, L))
    d = rng.uniform(0.5, 1.5, D)
    return slang.init(mu, U, d), slang.SLANGConfig(N=N, lam=np.ones(D), L=L)


def _start(init, config):
    """A start without further draws: init(mu) and config(N)."""
    return lambda mu, rng, N: (init(mu), config(N))


RECORDS: dict[str, Record] = {r.name: r for r in (
    Record("ngvi-full", ngvi.FullState, ngvi.NGVIConfig, ngvi.step_full, ngvi_draws,
           "derivations/ngvi.md"),
    Record("ngvi-meanfield", ngvi.MeanFieldState, ngvi.NGVIConfig, ngvi.step_meanfield,
           ngvi_draws, "derivations/ngvi.md"),
    Record("slang", slang.SLANGState, slang.SLANGConfig, slang.step, slang_draws,
           "derivations/slang.md",
           traces=(TraceStart("slang-mlp", _slang_start, {"M": 8, "S": 2, "L": 3},
                              sign_free=("U",)),)),
    Record("vogn", vogn.VOGNState, vogn.VOGNConfig, vogn.step, vogn_draws, "derivations/vogn.md",
           zero_samples=True,
           traces=(TraceStart("vogn", _vogn_start, {"M": 8, "S": 2, "curvature": "ef"}),
                   TraceStart("ogn", _vogn_start, {"M": 8, "curvature": "ef"}, S=0))),
    Record("vadam", vadam.VadamState, vadam.VadamConfig, vadam.step, gaussian_draws,
           "derivations/vadam.md",
           traces=(TraceStart("vadam", _start(vadam.init, lambda N: vadam.VadamConfig(
                       N, lam=1.0, alpha=0.1)), {"M": 8, "S": 2}),
                   TraceStart("vprop", _start(vadam.init, lambda N: vadam.vprop_config(
                       N, lam=1.0, alpha=0.1)), {"M": 8, "S": 2}))),
    Record("noisy-adam", noisy_adam.NoisyAdamState, noisy_adam.NoisyAdamConfig, noisy_adam.step,
           gaussian_draws, "derivations/noisy_adam.md",
           traces=(TraceStart("noisy-adam", _start(noisy_adam.init, lambda N: (
               noisy_adam.NoisyAdamConfig(N, prior_precision=1.0, alpha=0.1))), {"M": 8, "S": 2}),)),
    Record("bbb", bbb.BBBState, bbb.BBBConfig, bbb.step, gaussian_draws, "derivations/bbb.md",
           traces=(TraceStart("bbb", _start(lambda mu: bbb.init(mu, sigma0=0.3), lambda N: (
               bbb.BBBConfig(N, lam=1.0, alpha=0.1))), {"M": 8, "S": 2}),)),
    # traced by its own recipe (refbayes.tracing.ktied: its own problem and a jittered start)
    Record("ktied", ktied.KTiedState, ktied.KTiedConfig, ktied.step, gaussian_draws,
           "derivations/ktied.md"),
    Record("mc-dropout", mc_dropout.MCDropoutState, mc_dropout.MCDropoutConfig, mc_dropout.step,
           mask_draws, "derivations/mc_dropout.md",
           traces=(TraceStart("mc-dropout", _start(mc_dropout.init, lambda N: (
               mc_dropout.MCDropoutConfig(N, p=0.3, lengthscale=1.0, alpha=0.1))), {"M": 8}),)),
    # the MAP baseline of the Vadam paper; Adam's own equations are derived in derivations/bbb.md
    Record("adam", adam.MAPState, adam.MAPConfig, map_step, no_draws, "derivations/vadam.md",
           traces=(TraceStart("adam", _start(adam.init, lambda N: adam.MAPConfig(
               N, lam=1.0, adam=adam.AdamConfig(alpha=0.1))), {"M": 8}),)),
    Record("sgd", swag.SGDState, swag.SGDConfig, swag.sgd_step, no_draws, "derivations/swag.md"),
)}


def record_of(state, cfg) -> Record:
    """Find the record of a (state, cfg) pair.

    Parameters
    ----------
    state : NamedTuple
        A method's State.
    cfg : NamedTuple
        Its Config.

    Returns
    -------
    Record
        The first record whose State and Config classes they are instances of.

    Raises
    ------
    ValueError
        If no record has that pair; the message lists the supported pairs.
    """
    for r in RECORDS.values():
        if isinstance(state, r.state) and isinstance(cfg, r.config):
            return r
    pairs = ", ".join(f"({r.state.__name__}, {r.config.__name__})" for r in RECORDS.values())
    raise ValueError(f"state, cfg: expected one of the pairs {pairs}, got "
                     f"({type(state).__name__}, {type(cfg).__name__})")


def get_record(name: str) -> Record:
    """Find the record of a method by name.

    Parameters
    ----------
    name : str
        A key of ``RECORDS``, e.g. "vogn".

    Returns
    -------
    Record
        Its record.

    Raises
    ------
    ValueError
        If no method has that name; the message lists the known ones.
    """
    if name not in RECORDS:
        raise ValueError(f"method: expected one of {', '.join(RECORDS)}, got {name!r}")
    return RECORDS[name]
