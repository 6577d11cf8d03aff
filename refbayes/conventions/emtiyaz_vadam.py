"""emtiyaz/vadam ``VOGN``, ``Vadam`` and ``Vprop`` <-> ``vogn.VOGNConfig`` / ``vadam.VadamConfig``.

The initial precision ``prec_init`` of all three optimizers has its own pair
(``s0_from_emtiyaz_prec_init`` / ``emtiyaz_prec_init_from_s0``). derivations/vogn.md and
derivations/vadam.md, "Conventions of public implementations".
"""
from __future__ import annotations

import numpy as np

from refbayes._checks import check_in_range, check_int
from refbayes.conventions._common import _betas, _config, _fixed, _pos, _s_like, _scalar_prec
from refbayes.methods import vadam, vogn

__all__ = [
    "emtiyaz_prec_init_from_s0",
    "from_emtiyaz_vadam",
    "from_emtiyaz_vogn",
    "from_emtiyaz_vprop",
    "s0_from_emtiyaz_prec_init",
    "to_emtiyaz_vadam",
    "to_emtiyaz_vogn",
    "to_emtiyaz_vprop",
]


def from_emtiyaz_vogn(*, train_set_size, lr=1e-3, beta=0.999, prior_prec=1.0,
                      num_samples=1) -> vogn.VOGNConfig:
    """Convert emtiyaz/vadam ``VOGN`` keyword arguments to a VOGNConfig.

    derivations/vogn.md, Conventions: tau = rho = 1, gamma = 0, beta1 = 0, delta = prior_prec,
    alpha = lr, beta2 = 1 - beta, curvature "ef" (its closure's ``ggn`` is the per-example
    squares). ``prec_init``: ``s0_from_emtiyaz_prec_init``. Dropped: ``num_samples`` (the
    columns of eps).

    Parameters
    ----------
    train_set_size : int
        Training-set size N >= 1.
    lr : float, default 1e-3
        Learning rate, > 0.
    beta : float, default 0.999
        Weight of the old Precision, in [0, 1).
    prior_prec : float, default 1.0
        Prior precision, > 0.
    num_samples : int, default 1
        MC samples per step, >= 1 (not a config field).

    Returns
    -------
    vogn.VOGNConfig
        The config with the same step.

    Raises
    ------
    ValueError
        If an argument is out of range.
    """
    N = check_int(train_set_size, "train_set_size", low=1)
    beta = check_in_range(beta, "beta", 0.0, 1.0, high_open=True)
    check_int(num_samples, "num_samples", low=1)
    return vogn.VOGNConfig(N, _scalar_prec(prior_prec, "prior_prec", "VOGN's prior_prec"),
                           alpha=_pos(lr, "lr"), beta1=0.0, beta2=1.0 - beta, gamma=0.0,
                           tau=1.0, rho=1.0, curvature="ef")


def to_emtiyaz_vogn(cfg: vogn.VOGNConfig) -> dict:
    """Convert a VOGNConfig to emtiyaz/vadam ``VOGN`` keyword arguments.

    The inverse of ``from_emtiyaz_vogn``.

    Parameters
    ----------
    cfg : vogn.VOGNConfig
        A config with beta1 = 0, gamma = 0, tau = rho = 1, curvature "ef", scalar delta.

    Returns
    -------
    dict
        Keyword arguments train_set_size, lr, beta, prior_prec.

    Raises
    ------
    ValueError
        If cfg is not a VOGNConfig, or uses momentum, damping, tempering, augmentation or the
        "ggn" curvature (emtiyaz/vadam's VOGN has none of them).
    """
    _config(cfg, vogn.VOGNConfig)
    _fixed(cfg.beta1, "cfg.beta1", (0.0,), "emtiyaz/vadam's VOGN has no momentum")
    _fixed(cfg.gamma, "cfg.gamma", (0.0,), "emtiyaz/vadam's VOGN has no damping")
    _fixed(cfg.tau, "cfg.tau", (1.0,), "emtiyaz/vadam's VOGN has no tempering")
    _fixed(cfg.rho, "cfg.rho", (1.0,), "emtiyaz/vadam's VOGN has no augmentation factor")
    _fixed(cfg.curvature, "cfg.curvature", ("ef",), "its closure returns per-example squares")
    return {
        "train_set_size": check_int(cfg.N, "cfg.N", low=1),
        "lr": _pos(cfg.alpha, "cfg.alpha"),
        "beta": 1.0 - check_in_range(cfg.beta2, "cfg.beta2", 0.0, 1.0, low_open=True),
        "prior_prec": _scalar_prec(cfg.delta, "cfg.delta", "VOGN's prior_prec"),
    }


def from_emtiyaz_vadam(*, train_set_size, lr=1e-3, betas=(0.9, 0.999), prior_prec=1.0,
                       num_samples=1) -> vadam.VadamConfig:
    """Convert emtiyaz/vadam ``Vadam`` keyword arguments to a VadamConfig.

    derivations/vadam.md, Conventions: ``VadamConfig(N, lam=prior_prec, alpha=lr, beta1, beta2)``
    with squares "minibatch", sqrt=True, bias_correction=True. ``prec_init``:
    ``s0_from_emtiyaz_prec_init``. Dropped: ``num_samples`` (the columns of eps).

    Parameters
    ----------
    train_set_size : int
        Training-set size N >= 1.
    lr : float, default 1e-3
        Learning rate, > 0.
    betas : tuple of float, default (0.9, 0.999)
        (beta1, beta2), each in [0, 1).
    prior_prec : float, default 1.0
        Prior precision, > 0.
    num_samples : int, default 1
        MC samples per step, >= 1 (not a config field).

    Returns
    -------
    vadam.VadamConfig
        The config with the same step.

    Raises
    ------
    ValueError
        If an argument is out of range.
    """
    b1, b2 = _betas(betas)
    check_int(num_samples, "num_samples", low=1)
    return vadam.VadamConfig(check_int(train_set_size, "train_set_size", low=1),
                             _scalar_prec(prior_prec, "prior_prec", "Vadam's prior_prec"),
                             alpha=_pos(lr, "lr"), beta1=b1, beta2=b2, bias_correction=True,
                             squares="minibatch", sqrt=True)


def _vadam_fields(cfg, what: str):
    _config(cfg, vadam.VadamConfig)
    _fixed(cfg.squares, "cfg.squares", ("minibatch",), f"{what} squares the minibatch gradient")
    _fixed(cfg.sqrt, "cfg.sqrt", (True,), f"{what} takes sqrt(s)")
    return {
        "train_set_size": check_int(cfg.N, "cfg.N", low=1),
        "lr": _pos(cfg.alpha, "cfg.alpha"),
        "prior_prec": _scalar_prec(cfg.lam, "cfg.lam", f"{what}'s prior_prec"),
    }


def to_emtiyaz_vadam(cfg: vadam.VadamConfig) -> dict:
    """Convert a VadamConfig to emtiyaz/vadam ``Vadam`` keyword arguments.

    The inverse of ``from_emtiyaz_vadam``.

    Parameters
    ----------
    cfg : vadam.VadamConfig
        A config with bias_correction=True, squares "minibatch", sqrt=True, scalar lam.

    Returns
    -------
    dict
        Keyword arguments train_set_size, lr, betas, prior_prec.

    Raises
    ------
    ValueError
        If cfg is not a VadamConfig or uses a variant Vadam does not have.
    """
    out = _vadam_fields(cfg, "Vadam")
    _fixed(cfg.bias_correction, "cfg.bias_correction", (True,), "Vadam bias-corrects m and s")
    out["betas"] = _betas((cfg.beta1, cfg.beta2), "cfg.beta1, cfg.beta2")
    return {k: out[k] for k in ("train_set_size", "lr", "betas", "prior_prec")}


def from_emtiyaz_vprop(*, train_set_size, lr=1e-3, beta=0.999, prior_prec=1.0,
                       num_samples=1) -> vadam.VadamConfig:
    """Convert emtiyaz/vadam ``Vprop`` keyword arguments to a VadamConfig.

    derivations/vadam.md, Conventions: ``vprop_config(N, prior_prec, alpha=lr, beta2=beta)``
    (beta1 = 0, no bias correction). ``prec_init``: ``s0_from_emtiyaz_prec_init``. Dropped:
    ``num_samples`` (the columns of eps).

    Parameters
    ----------
    train_set_size : int
        Training-set size N >= 1.
    lr : float, default 1e-3
        Learning rate, > 0.
    beta : float, default 0.999
        Decay of the squared-gradient average, in [0, 1).
    prior_prec : float, default 1.0
        Prior precision, > 0.
    num_samples : int, default 1
        MC samples per step, >= 1 (not a config field).

    Returns
    -------
    vadam.VadamConfig
        The config with the same step.

    Raises
    ------
    ValueError
        If an argument is out of range.
    """
    check_int(num_samples, "num_samples", low=1)
    return vadam.vprop_config(check_int(train_set_size, "train_set_size", low=1),
                              _scalar_prec(prior_prec, "prior_prec", "Vprop's prior_prec"),
                              alpha=_pos(lr, "lr"),
                              beta2=check_in_range(beta, "beta", 0.0, 1.0, high_open=True))


def to_emtiyaz_vprop(cfg: vadam.VadamConfig) -> dict:
    """Convert a VadamConfig to emtiyaz/vadam ``Vprop`` keyword arguments.

    The inverse of ``from_emtiyaz_vprop``.

    Parameters
    ----------
    cfg : vadam.VadamConfig
        A config with beta1 = 0, bias_correction=False, squares "minibatch", sqrt=True.

    Returns
    -------
    dict
        Keyword arguments train_set_size, lr, beta, prior_prec.

    Raises
    ------
    ValueError
        If cfg is not a VadamConfig or uses momentum or bias correction (Vprop has neither).
    """
    out = _vadam_fields(cfg, "Vprop")
    _fixed(cfg.beta1, "cfg.beta1", (0.0,), "Vprop has no momentum")
    _fixed(cfg.bias_correction, "cfg.bias_correction", (False,), "Vprop has no bias correction")
    out["beta"] = check_in_range(cfg.beta2, "cfg.beta2", 0.0, 1.0, high_open=True)
    return {k: out[k] for k in ("train_set_size", "lr", "beta", "prior_prec")}


def _emtiyaz_lam_N(cfg):
    if isinstance(cfg, vadam.VadamConfig):
        lam = _scalar_prec(cfg.lam, "cfg.lam", "emtiyaz/vadam's prior_prec")
    elif isinstance(cfg, vogn.VOGNConfig):
        _fixed(cfg.tau, "cfg.tau", (1.0,), "emtiyaz/vadam's Precision is N s + prior_prec")
        _fixed(cfg.rho, "cfg.rho", (1.0,), "emtiyaz/vadam's Precision is N s + prior_prec")
        _fixed(cfg.gamma, "cfg.gamma", (0.0,), "emtiyaz/vadam's Precision is N s + prior_prec")
        lam = _scalar_prec(cfg.delta, "cfg.delta", "emtiyaz/vadam's prior_prec")
    else:
        raise ValueError(f"cfg: expected a VadamConfig or a VOGNConfig, got {type(cfg).__name__}")
    return lam, check_int(cfg.N, "cfg.N", low=1)


def s0_from_emtiyaz_prec_init(prec_init, cfg):
    """Convert emtiyaz/vadam's ``prec_init`` P_0 to the s_0 of ``vadam.init`` / ``vogn.init``.

    s_0 = (P_0 - prior_prec) / N, so that the first draws have precision N s_0 + prior_prec =
    P_0 (Vadam and Vprop set exp_avg_sq to it, VOGN its Precision to P_0; derivations/vadam.md
    and vogn.md, Conventions).

    Parameters
    ----------
    prec_init : float or array of shape (D,)
        The initial precision P_0 >= prior_prec.
    cfg : vadam.VadamConfig or vogn.VOGNConfig
        The config (N and the prior precision).

    Returns
    -------
    float or array of shape (D,)
        The initial s_0 >= 0.

    Raises
    ------
    ValueError
        If prec_init < prior_prec (refbayes requires s_0 >= 0; emtiyaz/vadam's VOGN default
        prec_init = 0 draws with infinite variance) or is not finite, or cfg is invalid.
    """
    lam, N = _emtiyaz_lam_N(cfg)
    p0 = _s_like(prec_init, "prec_init")
    if np.min(p0) < lam:
        raise ValueError(f"prec_init: expected >= prior_prec = {lam!r} (s_0 >= 0), "
                         f"got min {float(np.min(p0))!r}")
    return (p0 - lam) / N


def emtiyaz_prec_init_from_s0(s0, cfg):
    """Convert the initial s_0 of ``vadam.init`` / ``vogn.init`` to emtiyaz/vadam's ``prec_init``.

    P_0 = N s_0 + prior_prec, the inverse of ``s0_from_emtiyaz_prec_init``.

    Parameters
    ----------
    s0 : float or array of shape (D,)
        Initial s, >= 0.
    cfg : vadam.VadamConfig or vogn.VOGNConfig
        The config (N and the prior precision).

    Returns
    -------
    float or array of shape (D,)
        The emtiyaz/vadam prec_init.

    Raises
    ------
    ValueError
        If s0 is negative or not finite, or cfg is invalid.
    """
    lam, N = _emtiyaz_lam_N(cfg)
    s0 = _s_like(s0, "s0")
    if np.min(s0) < 0:
        raise ValueError(f"s0: expected >= 0, got min {float(np.min(s0))!r}")
    return N * s0 + lam

