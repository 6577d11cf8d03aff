"""The Bayes-by-Backprop baseline of aaronpmishkin/SLANG (``torch.optim.Adam`` on the loss
F_hat / N) <-> ``bbb.BBBConfig``.

derivations/bbb.md, "Conventions of public implementations".
"""
from __future__ import annotations

from refbayes._checks import check_int
from refbayes.conventions._common import _betas, _config, _fixed, _pos, _prec_or_array
from refbayes.methods import bbb

__all__ = [
    "from_slang_bbb",
    "to_slang_bbb",
]


def from_slang_bbb(*, train_set_size, prior_prec, lr=0.01, betas=(0.9, 0.99), eps=1e-8,
                   weight_decay=0.0, amsgrad=False) -> bbb.BBBConfig:
    """Convert the SLANG repository's BBB baseline (Adam on F_hat / N) to a BBBConfig.

    derivations/bbb.md, "Conventions of public implementations": its loss is refbayes' (bbb.3)
    objective / N with kl_weight = 1, and Adam is invariant to the gradient scale except through
    eps, so alpha = lr, beta1, beta2 = betas, eps_adam = N eps, lam = prior_prec (a (D,) array
    for its 1e-6 bias precision). Defaults are its UCI settings.

    Parameters
    ----------
    train_set_size : int
        Training-set size N >= 1.
    prior_prec : float or array of shape (D,)
        Prior precision > 0, per parameter in refbayes' theta order if an array.
    lr : float, default 0.01
        Adam learning rate, > 0.
    betas : tuple of float, default (0.9, 0.99)
        Adam (beta1, beta2), each in [0, 1).
    eps : float, default 1e-8
        Adam epsilon, > 0.
    weight_decay : float, default 0.0
        Must be 0 (the prior is in the KL).
    amsgrad : bool, default False
        Must be False.

    Returns
    -------
    bbb.BBBConfig
        The config with the same step.

    Raises
    ------
    ValueError
        If an argument is out of range or not representable.
    """
    N = check_int(train_set_size, "train_set_size", low=1)
    b1, b2 = _betas(betas)
    _fixed(weight_decay, "weight_decay", (0.0,), "the prior enters through the KL")
    _fixed(amsgrad, "amsgrad", (False,), "refbayes' Adam is (adam.1)-(adam.4)")
    return bbb.BBBConfig(N, _prec_or_array(prior_prec, "prior_prec"), alpha=_pos(lr, "lr"),
                         beta1=b1, beta2=b2, eps_adam=N * _pos(eps, "eps"), kl_weight=1.0)


def to_slang_bbb(cfg: bbb.BBBConfig) -> dict:
    """Convert a BBBConfig to the SLANG repository's BBB baseline settings.

    The inverse of ``from_slang_bbb``: eps = eps_adam / N.

    Parameters
    ----------
    cfg : bbb.BBBConfig
        A config with kl_weight = 1.

    Returns
    -------
    dict
        Keyword arguments train_set_size, prior_prec, lr, betas, eps, weight_decay, amsgrad.

    Raises
    ------
    ValueError
        If cfg is not a BBBConfig, has kl_weight != 1 (its objective is the ELBO), or an
        out-of-range field.
    """
    _config(cfg, bbb.BBBConfig)
    N = check_int(cfg.N, "cfg.N", low=1)
    _fixed(cfg.kl_weight, "cfg.kl_weight", (1.0,), "the SLANG baseline optimizes the ELBO")
    return {"train_set_size": N, "prior_prec": _prec_or_array(cfg.lam, "cfg.lam"),
            "lr": _pos(cfg.alpha, "cfg.alpha"),
            "betas": _betas((cfg.beta1, cfg.beta2), "cfg.beta1, cfg.beta2"),
            "eps": _pos(cfg.eps_adam, "cfg.eps_adam") / N, "weight_decay": 0.0,
            "amsgrad": False}

