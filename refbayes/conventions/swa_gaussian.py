"""wjmaddox/swa_gaussian: its base optimizer ``torch.optim.SGD`` <-> ``swag.SGDConfig``, and
``SWAG`` (with ``SWAG.sample``'s scale) <-> ``swag.SWAGConfig``.

derivations/swag.md, "Conventions of the official code".
"""
from __future__ import annotations

import math

from refbayes._checks import check_in_range, check_int
from refbayes.conventions._common import _config, _fixed, _nonneg, _pos
from refbayes.methods import swag

__all__ = [
    "from_swa_gaussian",
    "from_torch_sgd",
    "swa_gaussian_z2_factor",
    "to_swa_gaussian",
    "to_torch_sgd",
]


def from_torch_sgd(*, N, lr, momentum=0.0, weight_decay=0.0, dampening=0.0,
                   nesterov=False) -> swag.SGDConfig:
    """Convert ``torch.optim.SGD`` keyword arguments (on the mean loss) to an SGDConfig.

    derivations/swag.md, "Conventions of the official code": alpha = lr / N, lam = N
    weight_decay, the same momentum (torch's buffer is refbayes' v / N).

    Parameters
    ----------
    N : int
        Training-set size (the mean loss is the summed loss / N); not a torch argument.
    lr : float
        Learning rate, > 0.
    momentum : float, default 0.0
        Momentum in [0, 1).
    weight_decay : float, default 0.0
        L2 coefficient >= 0 on the mean loss.
    dampening : float, default 0.0
        Must be 0 (heavy ball).
    nesterov : bool, default False
        Must be False.

    Returns
    -------
    swag.SGDConfig
        The config with the same step.

    Raises
    ------
    ValueError
        If an argument is out of range, or dampening / nesterov is set.
    """
    N = check_int(N, "N", low=1)
    _fixed(dampening, "dampening", (0.0,), "(swag.11) is the undampened heavy ball")
    _fixed(nesterov, "nesterov", (False,), "(swag.11) is the heavy ball")
    return swag.SGDConfig(N, lam=N * _nonneg(weight_decay, "weight_decay"),
                          alpha=_pos(lr, "lr") / N,
                          momentum=check_in_range(momentum, "momentum", 0.0, 1.0, high_open=True))


def to_torch_sgd(cfg: swag.SGDConfig) -> dict:
    """Convert an SGDConfig to ``torch.optim.SGD`` keyword arguments on the mean loss.

    The inverse of ``from_torch_sgd``: lr = N alpha, weight_decay = lam / N; ``N`` is returned
    too (torch does not take it: the loss is the mean over the minibatch).

    Parameters
    ----------
    cfg : swag.SGDConfig
        A config with a scalar lam.

    Returns
    -------
    dict
        N, lr, momentum, weight_decay, dampening, nesterov.

    Raises
    ------
    ValueError
        If cfg is not an SGDConfig, has an array lam (torch's weight_decay is one number), or
        an out-of-range field.
    """
    _config(cfg, swag.SGDConfig)
    N = check_int(cfg.N, "cfg.N", low=1)
    if hasattr(cfg.lam, "shape"):
        raise ValueError(f"cfg.lam: expected a scalar >= 0 (torch's weight_decay is one number), "
                         f"got an array of shape {tuple(cfg.lam.shape)}")
    return {"N": N, "lr": N * _pos(cfg.alpha, "cfg.alpha"),
            "momentum": check_in_range(cfg.momentum, "cfg.momentum", 0.0, 1.0, high_open=True),
            "weight_decay": _nonneg(cfg.lam, "cfg.lam") / N, "dampening": 0.0, "nesterov": False}


def from_swa_gaussian(*, max_num_models, var_clamp=1e-30, scale=1.0, no_cov_mat=False,
                      block=False) -> swag.SWAGConfig:
    """Convert swa_gaussian ``SWAG(...)`` and ``SWAG.sample(...)`` arguments to a SWAGConfig.

    derivations/swag.md, "Conventions of the official code": K = max_num_models, the same
    var_clamp, and ``sample_fullrank``'s scale (covariance times scale) is refbayes' scale.
    While fewer than K snapshots are stored the official low-rank divisor is K - 1 and refbayes'
    K' - 1 (F2): the samples agree once n >= K. ``sample``'s ``cov`` (low-rank part or not) is
    refbayes' z2 (None or an array), not a config field.

    Parameters
    ----------
    max_num_models : int
        Size K >= 1 of the deviation buffer.
    var_clamp : float, default 1e-30
        Floor >= 0 of the diagonal variance.
    scale : float, default 1.0
        ``sample``'s scale, > 0 (the paper's SWAG uses 0.5).
    no_cov_mat : bool, default False
        Must be False (refbayes always keeps the deviation buffer).
    block : bool, default False
        Must be False: ``sample_blockwise`` has covariance scale^2 (Sigma_diag +
        blockdiag_b(D_b D_b^T) / (K - 1)), one independent low-rank draw per parameter tensor
        (E1); it is refbayes' ``sample`` on each tensor's own moments at scale^2.

    Returns
    -------
    swag.SWAGConfig
        The config with the same moments and samples.

    Raises
    ------
    ValueError
        If an argument is out of range, or no_cov_mat / block is set.
    """
    _fixed(no_cov_mat, "no_cov_mat", (False,), "refbayes' SWAG keeps the deviation buffer")
    _fixed(block, "block", (False,), "sample_blockwise has covariance scale^2 (Sigma_diag + "
           "the per-tensor block diagonal of the low-rank term) (E1)")
    return swag.SWAGConfig(K=check_int(max_num_models, "max_num_models", low=1),
                           scale=_pos(scale, "scale"),
                           var_clamp=_nonneg(var_clamp, "var_clamp"))


def swa_gaussian_z2_factor(n, max_num_models) -> float:
    """The factor on refbayes' z2 that makes ``swag.sample`` draw the official code's samples.

    The official low-rank term divides by K - 1 = max_num_models - 1 even while only
    K' = min(n, K) < K deviations are stored; refbayes divides by K' - 1 (swag.5), (F2). So
    ``swag.sample(state, z1, factor * z2, cfg)`` with ``cfg = from_swa_gaussian(...)`` is
    ``sample_fullrank``'s draw for the same standard normals, and its covariance is
    scale (Sigma_diag + ((K' - 1) / (K - 1)) D_hat D_hat^T / (K' - 1)). The factor is
    sqrt((K' - 1) / (K - 1)): 1 once n >= K.

    Parameters
    ----------
    n : int
        Snapshots collected, >= 2 (the low-rank term needs two).
    max_num_models : int
        The official K, >= 2.

    Returns
    -------
    float
        The factor sqrt((min(n, K) - 1) / (K - 1)).

    Raises
    ------
    ValueError
        If n or max_num_models is not an integer >= 2.
    """
    n = check_int(n, "n", low=2)
    K = check_int(max_num_models, "max_num_models", low=2)
    return math.sqrt((min(n, K) - 1) / (K - 1))  # (swag.5), (F2)


def to_swa_gaussian(cfg: swag.SWAGConfig) -> dict:
    """Convert a SWAGConfig to swa_gaussian ``SWAG(...)`` / ``sample(...)`` keyword arguments.

    The inverse of ``from_swa_gaussian``; ``scale`` belongs to ``SWAG.sample``, the rest to
    the constructor.

    Parameters
    ----------
    cfg : swag.SWAGConfig
        The config.

    Returns
    -------
    dict
        Keyword arguments max_num_models, var_clamp, scale, no_cov_mat, block.

    Raises
    ------
    ValueError
        If cfg is not a SWAGConfig or has an out-of-range field.
    """
    _config(cfg, swag.SWAGConfig)
    return {"max_num_models": check_int(cfg.K, "cfg.K", low=1),
            "var_clamp": _nonneg(cfg.var_clamp, "cfg.var_clamp"),
            "scale": _pos(cfg.scale, "cfg.scale"), "no_cov_mat": False, "block": False}

