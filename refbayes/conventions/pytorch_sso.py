"""torchsso (cybertronai/pytorch-sso) ``VIOptimizer`` / ``VOGN`` <-> ``vogn.VOGNConfig``, and
``VIOptimizer`` with Kronecker curvature <-> ``noisy_kfac.NoisyKFACConfig``.

The optimizer that team-approx-bayes/dl-with-bayes uses; VOGN's initial precision has its own
pair (``s0_from_pytorch_sso_init_precision`` / ``pytorch_sso_init_precision_from_s0``).
derivations/vogn.md, "Conventions of public implementations"; derivations/noisy_kfac.md,
"Conventions of torchsso".
"""
from __future__ import annotations

import numpy as np

from refbayes._checks import check_in_range, check_int
from refbayes.conventions._common import (_config, _count, _fixed, _nonneg, _pos, _s_like,
                                          _scalar_prec)
from refbayes.methods import noisy_kfac as nk
from refbayes.methods import vogn

__all__ = [
    "from_pytorch_sso_noisy_kfac",
    "from_pytorch_sso_vogn",
    "pytorch_sso_init_precision_from_s0",
    "s0_from_pytorch_sso_init_precision",
    "to_pytorch_sso_noisy_kfac",
    "to_pytorch_sso_vogn",
]


def from_pytorch_sso_vogn(*, dataset_size, lr=0.01, momentum=0.0, momentum_type="preconditioned",
                          grad_ema_decay=1.0, grad_ema_type="raw", curv_type="Cov",
                          curv_kwargs=None, num_mc_samples=10, kl_weighting=1.0,
                          warmup_kl_weighting_steps=None, prior_variance=1.0, weight_decay=0.0,
                          bias_correction=False, acc_steps=1, lars=False,
                          normalizing_weights=False) -> vogn.VOGNConfig:
    """Convert torchsso ``VIOptimizer`` / ``VOGN`` keyword arguments to a VOGNConfig.

    derivations/vogn.md, "Conventions of public implementations": N = dataset_size (rho = 1;
    dl-with-bayes' ``dataset_size_scale`` is already inside dataset_size), tau = kl_weighting,
    delta = 1 / prior_variance, gamma = curv_kwargs['damping'], beta2 = curv_kwargs['ema_decay'],
    curvature "ef" (curv_type 'Cov'). Momentum: momentum_type 'raw' with momentum b gives
    beta1 = b, alpha = lr; grad_ema_decay d < 1 (with momentum 0) gives beta1 = 1 - d,
    alpha = lr d (the (vogn.7) reparameterisation). Defaults are VIOptimizer's; the ``VOGN``
    subclass changes some (warmup_kl_weighting_steps = 1000, grad_ema_decay = 0.1, ...): pass
    them. Dropped, no effect on the step: ``num_mc_samples`` (K is the number of columns of
    eps), ``val_num_mc_samples``, ``seed``, ``curv_shapes`` (must be 'Diag' per layer).

    Parameters
    ----------
    dataset_size : int
        Training-set size N (an integer-valued float is accepted).
    lr : float, default 0.01
        Learning rate, > 0.
    momentum : float, default 0.0
        Momentum b in [0, 1); b > 0 needs momentum_type 'raw'.
    momentum_type : {"raw", "preconditioned"}, default "preconditioned"
        Which gradient the momentum accumulates; only 'raw' is Algorithm 1.
    grad_ema_decay : float, default 1.0
        Gradient EMA weight d in (0, 1]; d < 1 needs momentum 0 and grad_ema_type 'raw'.
    grad_ema_type : {"raw"}, default "raw"
        The gradient the EMA is taken of.
    curv_type : {"Cov"}, default "Cov"
        The curvature: per-example squared gradients (refbayes "ef").
    curv_kwargs : dict
        ``{'ema_decay': beta2 in (0, 1], 'damping': gamma >= 0}`` (required keys).
    num_mc_samples : int, default 10
        MC samples per step, >= 1 (refbayes: the columns of eps; not a config field).
    kl_weighting : float, default 1.0
        KL weight tau > 0.
    warmup_kl_weighting_steps : None, default None
        KL warm-up; must be None (refbayes has no warm-up).
    prior_variance : float, default 1.0
        Prior variance > 0; delta = 1 / prior_variance.
    weight_decay : float, default 0.0
        Extra decoupled weight decay; must be 0.
    bias_correction : bool, default False
        Must be False.
    acc_steps : int, default 1
        Gradient accumulation steps; must be 1.
    lars : bool, default False
        Must be False.
    normalizing_weights : bool, default False
        Must be False.

    Returns
    -------
    vogn.VOGNConfig
        The config with the same step (curvature "ef", rho = 1).

    Raises
    ------
    ValueError
        If an argument is out of range or has a value refbayes cannot represent.
    """
    N = _count(dataset_size, "dataset_size")
    lr = _pos(lr, "lr")
    momentum = check_in_range(momentum, "momentum", 0.0, 1.0, high_open=True)
    d = check_in_range(grad_ema_decay, "grad_ema_decay", 0.0, 1.0, low_open=True)
    _fixed(momentum_type, "momentum_type", ("raw", "preconditioned"), "torchsso's two types")
    _fixed(grad_ema_type, "grad_ema_type", ("raw",), "Algorithm 1 averages the raw gradient")
    _fixed(curv_type, "curv_type", ("Cov",), "per-example squared gradients, refbayes 'ef'")
    if not isinstance(curv_kwargs, dict) or set(curv_kwargs) != {"ema_decay", "damping"}:
        raise ValueError("curv_kwargs: expected a dict with exactly the keys 'ema_decay' and "
                         f"'damping', got {curv_kwargs!r}")
    beta2 = check_in_range(curv_kwargs["ema_decay"], "curv_kwargs['ema_decay']", 0.0, 1.0,
                           low_open=True)
    gamma = _nonneg(curv_kwargs["damping"], "curv_kwargs['damping']")
    check_int(num_mc_samples, "num_mc_samples", low=1)
    tau = _pos(kl_weighting, "kl_weighting")
    _fixed(warmup_kl_weighting_steps, "warmup_kl_weighting_steps", (None,),
           "refbayes has no KL warm-up; it moves delta~ and sigma during the first steps")
    delta = 1.0 / _pos(prior_variance, "prior_variance")
    _fixed(weight_decay, "weight_decay", (0.0,), "no decoupled weight decay in Algorithm 1")
    _fixed(bias_correction, "bias_correction", (False,), "Algorithm 1 has no bias correction")
    _fixed(acc_steps, "acc_steps", (1,), "one minibatch per step")
    _fixed(lars, "lars", (False,), "no LARS in Algorithm 1")
    _fixed(normalizing_weights, "normalizing_weights", (False,), "no weight normalization")
    if momentum > 0 and d < 1:
        raise ValueError(f"momentum, grad_ema_decay: expected momentum = 0 or grad_ema_decay = 1 "
                         f"(both together are not one heavy-ball rate), got {momentum}, {d}")
    if momentum > 0 and momentum_type != "raw":
        raise ValueError("momentum_type: expected 'raw' with momentum > 0 ('preconditioned' "
                         "accumulates the preconditioned direction, not (vogn.7)), got "
                         f"{momentum_type!r}")
    if d < 1:
        beta1, alpha = 1.0 - d, lr * d                     # (vogn.7) reparameterisation
    else:
        beta1, alpha = momentum, lr
    return vogn.VOGNConfig(N, delta, alpha=alpha, beta1=beta1, beta2=beta2, gamma=gamma,
                           tau=tau, rho=1.0, curvature="ef")


def to_pytorch_sso_vogn(cfg: vogn.VOGNConfig) -> dict:
    """Convert a VOGNConfig to torchsso ``VIOptimizer`` / ``VOGN`` keyword arguments.

    The inverse of ``from_pytorch_sso_vogn``, always in the 'raw' momentum form
    (momentum = beta1, grad_ema_decay = 1). ``num_mc_samples`` is not a config field: set it
    to the number of columns of eps.

    Parameters
    ----------
    cfg : vogn.VOGNConfig
        A config with rho = 1, curvature "ef" and a scalar delta.

    Returns
    -------
    dict
        Keyword arguments dataset_size, lr, momentum, momentum_type, grad_ema_decay,
        grad_ema_type, curv_type, curv_kwargs, kl_weighting, warmup_kl_weighting_steps,
        prior_variance.

    Raises
    ------
    ValueError
        If cfg is not a VOGNConfig, has rho != 1 (fold it into N), curvature "ggn", an array
        delta, or an out-of-range field.
    """
    _config(cfg, vogn.VOGNConfig)
    N = check_int(cfg.N, "cfg.N", low=1)
    delta = _scalar_prec(cfg.delta, "cfg.delta", "torchsso's prior_variance")
    _fixed(cfg.rho, "cfg.rho", (1.0,), "torchsso has no augmentation factor: use N = rho N")
    _fixed(cfg.curvature, "cfg.curvature", ("ef",), "torchsso's 'Cov' is per-example squares")
    return {
        "dataset_size": N,
        "lr": _pos(cfg.alpha, "cfg.alpha"),
        "momentum": check_in_range(cfg.beta1, "cfg.beta1", 0.0, 1.0, high_open=True),
        "momentum_type": "raw",
        "grad_ema_decay": 1.0,
        "grad_ema_type": "raw",
        "curv_type": "Cov",
        "curv_kwargs": {
            "ema_decay": check_in_range(cfg.beta2, "cfg.beta2", 0.0, 1.0, low_open=True),
            "damping": _nonneg(cfg.gamma, "cfg.gamma"),
        },
        "kl_weighting": _pos(cfg.tau, "cfg.tau"),
        "warmup_kl_weighting_steps": None,
        "prior_variance": 1.0 / delta,
    }


def _delta_tilde(cfg: vogn.VOGNConfig) -> float:
    delta = _scalar_prec(cfg.delta, "cfg.delta", "torchsso's prior_variance")
    N_eff = check_int(cfg.N, "cfg.N", low=1) * _pos(cfg.rho, "cfg.rho")
    return _pos(cfg.tau, "cfg.tau") * delta / N_eff



def s0_from_pytorch_sso_init_precision(init_precision, cfg: vogn.VOGNConfig):
    """Convert torchsso's ``init_precision`` p_0 to the initial curvature s_0 of ``vogn.init``.

    s_0 = p_0 - delta~, delta~ = tau delta / (rho N) (vogn.2): torchsso's running prior term
    starts at 0, so its ema + l2_ema is the running average of hhat + delta~ started at p_0
    (derivations/vogn.md, Conventions). Without init_precision torchsso's first step is OGN
    (eps=None) with beta2 = 1: no s_0 reproduces that.

    Parameters
    ----------
    init_precision : float or array of shape (D,)
        The torchsso initial precision p_0 >= delta~.
    cfg : vogn.VOGNConfig
        The config (N, delta, tau, rho give delta~).

    Returns
    -------
    float or array of shape (D,)
        The initial s_0 >= 0.

    Raises
    ------
    ValueError
        If init_precision < delta~ (refbayes requires s_0 >= 0) or is not finite, or cfg is
        invalid.
    """
    _config(cfg, vogn.VOGNConfig)
    p0 = _s_like(init_precision, "init_precision")
    dt = _delta_tilde(cfg)
    s0 = p0 - dt
    if np.min(s0) < 0:
        raise ValueError(f"init_precision: expected >= delta~ = tau delta / (rho N) = {dt!r} "
                         f"(s_0 >= 0), got min {float(np.min(p0))!r}")
    return s0


def pytorch_sso_init_precision_from_s0(s0, cfg: vogn.VOGNConfig):
    """Convert the initial curvature s_0 of ``vogn.init`` to torchsso's ``init_precision``.

    p_0 = s_0 + delta~, the inverse of ``s0_from_pytorch_sso_init_precision``.

    Parameters
    ----------
    s0 : float or array of shape (D,)
        Initial curvature, >= 0.
    cfg : vogn.VOGNConfig
        The config (N, delta, tau, rho give delta~).

    Returns
    -------
    float or array of shape (D,)
        The torchsso init_precision.

    Raises
    ------
    ValueError
        If s0 is negative or not finite, or cfg is invalid.
    """
    _config(cfg, vogn.VOGNConfig)
    s0 = _s_like(s0, "s0")
    if np.min(s0) < 0:
        raise ValueError(f"s0: expected >= 0, got min {float(np.min(s0))!r}")
    return s0 + _delta_tilde(cfg)



# ----------------------------------------------------------------------------- Noisy K-FAC

_CURVATURES = {"Cov": "ef", "Fisher": "mc"}


def from_pytorch_sso_noisy_kfac(*, dataset_size, curv_shapes, curv_kwargs, lr=0.01,
                                momentum=0.0, momentum_type="preconditioned",
                                grad_ema_decay=1.0, curv_type="Fisher", num_mc_samples=10,
                                kl_weighting=1.0, warmup_kl_weighting_steps=None,
                                prior_variance=1.0, weight_decay=0.0, bias_correction=False,
                                acc_steps=1, lars=False,
                                normalizing_weights=False) -> nk.NoisyKFACConfig:
    """Convert torchsso ``VIOptimizer`` keyword arguments with Kronecker curvature to a config.

    torchsso's Noisy K-FAC (dl-with-bayes' ``lenet_noisykfac.json``) -> a NoisyKFACConfig.
    derivations/noisy_kfac.md, "Conventions of torchsso": N = dataset_size, eta =
    prior_variance, kl_weight = kl_weighting, alpha = lr, beta = curv_kwargs['ema_decay'],
    gamma_ex = curv_kwargs['damping'], momentum and momentum_type as they are ('preconditioned'
    is (noisy_kfac.11), 'raw' (noisy_kfac.20)), weight_decay as is (added after the solve), and
    torchsso's sampler and order:
    sampler_damping "full", refresh_order "before", T_stats = T_inv = 1, factored damping with
    pi by trace norms. curv_type 'Cov' is curvature "ef"; 'Fisher' is "mc" (one sampled label
    per row, ``get_closure_for_fisher``'s ``num_mc`` 1: the caller passes y_tilde). Dropped, no
    effect on the step: ``num_mc_samples`` (S is the number of columns of eps).

    The step is torchsso's when the draws average to the mean: torchsso adds its prior term
    gamma_in mu at the MEAN, refbayes gamma_in w at each draw (noisy_kfac.8). torchsso's first
    step draws nothing and replaces the start factors with its statistics: that is
    ``noisy_kfac.step`` with eps=None and ``beta=1`` (``cfg._replace(beta=1.0)``). Its draws
    are not refbayes': its sampler's output side has the covariance U_G U_G^T, not G_g^{-1}
    (noisy_kfac.md, S1); a replay hands refbayes torchsso's draws
    (tools/torchsso_noisy_kfac_check.py).

    Parameters
    ----------
    dataset_size : int
        Training-set size N (an integer-valued float is accepted).
    curv_shapes : dict
        The curvature shape per layer class; every value must be 'Kron'.
    curv_kwargs : dict
        ``{'ema_decay': beta in (0, 1], 'damping': gamma_ex >= 0}``, optionally
        ``'pi_type': 'tracenorm'``.
    lr : float, default 0.01
        Learning rate alpha > 0.
    momentum : float, default 0.0
        Momentum in [0, 1).
    momentum_type : {"preconditioned", "raw"}, default "preconditioned"
        Which gradient the momentum accumulates: the solve's (noisy_kfac.11) or the raw one,
        solved after (noisy_kfac.20).
    grad_ema_decay : float, default 1.0
        Must be 1 (no gradient EMA).
    curv_type : {"Fisher", "Cov"}, default "Fisher"
        The output factor's statistics: sampled labels ("mc") or the true ones ("ef").
    num_mc_samples : int, default 10
        Draws per step, >= 1 (refbayes: the columns of eps; not a config field).
    kl_weighting : float, default 1.0
        KL weight lambda > 0.
    warmup_kl_weighting_steps : None, default None
        Must be None (refbayes has no KL warm-up).
    prior_variance : float, default 1.0
        Prior variance eta > 0.
    weight_decay : float, default 0.0
        Decoupled weight decay delta >= 0, added after the solve (noisy_kfac.11).
    bias_correction : bool, default False
        Must be False.
    acc_steps : int, default 1
        Must be 1.
    lars : bool, default False
        Must be False.
    normalizing_weights : bool, default False
        Must be False.

    Returns
    -------
    noisy_kfac.NoisyKFACConfig
        The config with torchsso's step.

    Raises
    ------
    ValueError
        If an argument is out of range or has a value refbayes cannot represent.
    """
    N = _count(dataset_size, "dataset_size")
    if not isinstance(curv_shapes, dict) or not curv_shapes or \
            any(v != "Kron" for v in curv_shapes.values()):
        raise ValueError("curv_shapes: expected a dict of 'Kron' for every layer class (Noisy "
                         f"K-FAC's factors), got {curv_shapes!r}")
    if not isinstance(curv_kwargs, dict) or \
            not {"ema_decay", "damping"} <= set(curv_kwargs) <= {"ema_decay", "damping", "pi_type"}:
        raise ValueError("curv_kwargs: expected a dict with the keys 'ema_decay' and 'damping' "
                         f"(and optionally 'pi_type'), got {curv_kwargs!r}")
    _fixed(curv_kwargs.get("pi_type", "tracenorm"), "curv_kwargs['pi_type']", ("tracenorm",),
           "refbayes' factored damping splits sqrt(gamma) by pi from the trace norms (kron.8)")
    beta = check_in_range(curv_kwargs["ema_decay"], "curv_kwargs['ema_decay']", 0.0, 1.0,
                          low_open=True)
    gamma_ex = _nonneg(curv_kwargs["damping"], "curv_kwargs['damping']")
    momentum = check_in_range(momentum, "momentum", 0.0, 1.0, high_open=True)
    _fixed(momentum_type, "momentum_type", nk.MOMENTUM_TYPES, "torchsso's two types")
    _fixed(grad_ema_decay, "grad_ema_decay", (1.0,), "no gradient EMA in (noisy_kfac.11)")
    _fixed(curv_type, "curv_type", tuple(_CURVATURES), "Kronecker factors from gradients")
    check_int(num_mc_samples, "num_mc_samples", low=1)
    _fixed(warmup_kl_weighting_steps, "warmup_kl_weighting_steps", (None,),
           "refbayes has no KL warm-up; it moves gamma_in and the covariance")
    _fixed(bias_correction, "bias_correction", (False,), "no bias correction in Noisy K-FAC")
    _fixed(acc_steps, "acc_steps", (1,), "one minibatch per step")
    _fixed(lars, "lars", (False,), "no LARS in Noisy K-FAC")
    _fixed(normalizing_weights, "normalizing_weights", (False,), "no weight normalization")
    return nk.NoisyKFACConfig(N, eta=_pos(prior_variance, "prior_variance"),
                              kl_weight=_pos(kl_weighting, "kl_weighting"),
                              alpha=_pos(lr, "lr"), beta=beta, momentum=momentum,
                              gamma_ex=gamma_ex, T_stats=1, T_inv=1, damping="factored",
                              curvature=_CURVATURES[curv_type],
                              weight_decay=_nonneg(weight_decay, "weight_decay"),
                              sampler_damping="full", refresh_order="before",
                              momentum_type=momentum_type)


def to_pytorch_sso_noisy_kfac(cfg: nk.NoisyKFACConfig) -> dict:
    """Convert a NoisyKFACConfig to torchsso ``VIOptimizer`` keyword arguments.

    The inverse of ``from_pytorch_sso_noisy_kfac`` (curv_shapes for ``Linear`` and ``Conv2d``
    layers). ``num_mc_samples`` is not a config field: set it to the number of columns of eps.

    Parameters
    ----------
    cfg : noisy_kfac.NoisyKFACConfig
        A config with torchsso's step: sampler_damping "full", refresh_order "before",
        T_stats = T_inv = 1, factored damping, curvature "ef" or "mc", no KL clipping.

    Returns
    -------
    dict
        Keyword arguments dataset_size, curv_type, curv_shapes, curv_kwargs, lr, momentum,
        momentum_type, kl_weighting, warmup_kl_weighting_steps, prior_variance, weight_decay.

    Raises
    ------
    ValueError
        If cfg is not a NoisyKFACConfig or has a field torchsso cannot represent.
    """
    _config(cfg, nk.NoisyKFACConfig)
    nk.gamma_in(cfg)  # every field checked
    _fixed(cfg.sampler_damping, "cfg.sampler_damping", ("full",),
           "torchsso draws with the solve's damping")
    _fixed(cfg.refresh_order, "cfg.refresh_order", ("before",),
           "torchsso refreshes the factors before the solve")
    _fixed(cfg.T_stats, "cfg.T_stats", (1,), "torchsso updates the factors every step")
    _fixed(cfg.T_inv, "cfg.T_inv", (1,), "torchsso inverts the factors every step")
    _fixed(cfg.damping, "cfg.damping", ("factored",), "torchsso damps each factor")
    _fixed(cfg.curvature, "cfg.curvature", tuple(_CURVATURES.values()),
           "torchsso's 'Cov' and 'Fisher'; it has no GGN factors")
    _fixed(cfg.kl_clip, "cfg.kl_clip", (None,), "torchsso has no KL clipping")
    curv_type = {v: k for k, v in _CURVATURES.items()}[cfg.curvature]
    return {
        "dataset_size": cfg.N,
        "curv_type": curv_type,
        "curv_shapes": {"Linear": "Kron", "Conv2d": "Kron"},
        "curv_kwargs": {"ema_decay": float(cfg.beta), "damping": float(cfg.gamma_ex),
                        "pi_type": "tracenorm"},
        "lr": float(cfg.alpha),
        "momentum": float(cfg.momentum),
        "momentum_type": cfg.momentum_type,
        "kl_weighting": float(cfg.kl_weight),
        "warmup_kl_weighting_steps": None,
        "prior_variance": float(cfg.eta),
        "weight_decay": float(cfg.weight_decay),
    }
