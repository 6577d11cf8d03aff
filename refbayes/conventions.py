"""Public implementations' hyperparameters <-> refbayes configs.

One pair of pure functions per public implementation: ``from_<library>(...)`` takes the public
constructor's keyword arguments (spelled as that library spells them) and returns the refbayes
Config whose ``step`` takes the same step; ``to_<library>(cfg)`` returns a dict of those keyword
arguments. ``from_<library>(**to_<library>(cfg)) == cfg`` to float rounding. Every conversion
is the one stated in the derivation note named below; nothing here is new. Quantities that live
in a method's initial STATE rather than in its Config (the initial precision) have their own
pair of functions. ``CONVENTIONS`` lists every pair.

Mapped (public -> refbayes):

- ``from_pytorch_sso_vogn`` / ``to_pytorch_sso_vogn``: torchsso ``VIOptimizer`` / ``VOGN``
  (cybertronai/pytorch-sso, used by team-approx-bayes/dl-with-bayes) -> ``vogn.VOGNConfig``;
  initial state: ``s0_from_pytorch_sso_init_precision`` / ``pytorch_sso_init_precision_from_s0``.
  derivations/vogn.md, "Conventions of public implementations".
- ``from_emtiyaz_vogn`` / ``to_emtiyaz_vogn``: emtiyaz/vadam ``VOGN`` -> ``vogn.VOGNConfig``.
  derivations/vogn.md, same section.
- ``from_emtiyaz_vadam`` / ``to_emtiyaz_vadam``: emtiyaz/vadam ``Vadam`` ->
  ``vadam.VadamConfig``; ``from_emtiyaz_vprop`` / ``to_emtiyaz_vprop``: emtiyaz/vadam ``Vprop``
  -> ``vadam.VadamConfig`` (``vadam.vprop_config``). Initial state of all three emtiyaz/vadam
  optimizers: ``s0_from_emtiyaz_prec_init`` / ``emtiyaz_prec_init_from_s0``.
  derivations/vadam.md, "Conventions of public implementations".
- ``from_torch_sgd`` / ``to_torch_sgd``: ``torch.optim.SGD`` on the mean loss (the base
  optimizer of wjmaddox/swa_gaussian) -> ``swag.SGDConfig``; ``from_swa_gaussian`` /
  ``to_swa_gaussian``: swa_gaussian ``SWAG`` (and its ``sample(scale)``) -> ``swag.SWAGConfig``.
  derivations/swag.md, "Conventions of the official code".
- ``from_laplace_torch`` / ``to_laplace_torch``: aleximmer/Laplace ``Laplace(...)`` ->
  ``laplace.LaplaceConfig``. derivations/laplace.md, "Conventions of public implementations".
- ``from_slang_bbb`` / ``to_slang_bbb``: the Bayes-by-Backprop baseline of aaronpmishkin/SLANG
  (``torch.optim.Adam`` on the loss F_hat / N) -> ``bbb.BBBConfig``. derivations/bbb.md,
  "Conventions of public implementations".

Not mapped (the notes give no exact step-for-step conversion; see each note): the official
SLANG code (its PyTorch keyword names are not in slang.md, its randomized fast_eig drops columns
and clips Delta_d), Noisy Adam (the official ``adam_optimizer.py`` does not run), Noisy K-FAC
(statistics at a fresh draw, identity inverses until ``TInv``, another sampling map and
momentum form: noisy_kfac.md C1-C3), MC dropout (Keras Adam's epsilon makes the map
step-dependent, and the training-target precision is a free choice), PyTorch-BayesianCNN and
Blundell et al. (no constructor keyword names in bbb.md), K-tied (no public implementation).

Every function validates its inputs and raises ``ValueError`` naming the argument, what was
expected and what was given. A public hyperparameter that refbayes cannot represent (a KL
warm-up, 'preconditioned' momentum, a temperature != 1, ...) is refused unless it is set to the
value that makes it a no-op; a refbayes field that the public code cannot represent (tempering
for emtiyaz/vadam, the "ggn" curvature for torchsso, ...) is refused by ``to_*`` likewise.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, NamedTuple

import numpy as np

from refbayes._checks import check_array, check_float, check_in_range, check_int, check_positive
from refbayes.methods import bbb, laplace, swag, vadam, vogn

__all__ = [
    "CONVENTIONS",
    "Convention",
    "emtiyaz_prec_init_from_s0",
    "from_emtiyaz_vadam",
    "from_emtiyaz_vogn",
    "from_emtiyaz_vprop",
    "from_laplace_torch",
    "from_pytorch_sso_vogn",
    "from_slang_bbb",
    "from_swa_gaussian",
    "from_torch_sgd",
    "pytorch_sso_init_precision_from_s0",
    "s0_from_emtiyaz_prec_init",
    "s0_from_pytorch_sso_init_precision",
    "to_emtiyaz_vadam",
    "to_emtiyaz_vogn",
    "to_emtiyaz_vprop",
    "to_laplace_torch",
    "to_pytorch_sso_vogn",
    "to_slang_bbb",
    "to_swa_gaussian",
    "to_torch_sgd",
]

INF = math.inf


class Convention(NamedTuple):
    """One public implementation mapped onto a refbayes config.

    Attributes
    ----------
    name : str
        Registry key, the suffix of the function pair (``from_<name>``, ``to_<name>``).
    library : str
        The public implementation: repository or package, and the class.
    method : str
        The refbayes method module, ``refbayes.methods.<method>``.
    derivation : str
        Derivation note and section that state the conversion.
    to_refbayes : callable
        ``from_<name>``: the public keyword arguments -> the refbayes Config.
    from_refbayes : callable
        ``to_<name>``: the refbayes Config -> a dict of the public keyword arguments.
    summary : str
        One line: the conversion in short.
    """
    name: str
    library: str
    method: str
    derivation: str
    to_refbayes: Callable[..., Any]
    from_refbayes: Callable[..., dict]
    summary: str


# ----------------------------------------------------------------------------- checks

def _pos(x, name: str) -> float:
    """A finite real > 0."""
    return check_in_range(x, name, 0.0, INF, low_open=True, high_open=True)


def _nonneg(x, name: str) -> float:
    """A finite real >= 0."""
    return check_in_range(x, name, 0.0, INF, high_open=True)


def _count(n, name: str) -> int:
    """An integer >= 1; an integer-valued float (torchsso types dataset_size as float) too."""
    if isinstance(n, float) and math.isfinite(n) and n.is_integer():
        n = int(n)
    return check_int(n, name, low=1)


def _fixed(value, name: str, allowed, why: str):
    """Refuse a public hyperparameter that refbayes cannot represent unless it is a no-op."""
    def same(a):
        if value is a or (type(value) is type(a) and value == a):
            return True
        return (isinstance(a, float) and isinstance(value, numbers.Real)
                and not isinstance(value, bool) and float(value) == a)
    ok = any(same(a) for a in allowed)
    if not ok:
        want = " or ".join(repr(a) for a in allowed)
        raise ValueError(f"{name}: expected {want} ({why}), got {value!r}")
    return value


def _config(cfg, cls, name: str = "cfg"):
    if not isinstance(cfg, cls):
        raise ValueError(f"{name}: expected a {cls.__name__}, got {type(cfg).__name__}")
    return cfg


def _scalar_prec(x, name: str, what: str) -> float:
    """A scalar precision > 0; an array is refused (the public code takes one number)."""
    if hasattr(x, "shape"):
        raise ValueError(f"{name}: expected a scalar > 0 ({what} takes one number), "
                         f"got an array of shape {tuple(x.shape)}")
    return _pos(x, name)


def _prec_or_array(x, name: str):
    """A scalar > 0 or a finite float 1-d array > 0 (returned as given)."""
    if hasattr(x, "shape"):
        check_array(x, name, ndim=1)
        check_float(x, name)
        check_positive(x, name)
        return x
    return _pos(x, name)


def _betas(betas, name: str = "betas") -> tuple[float, float]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{name}: expected a pair (beta1, beta2), got {betas!r}")
    b1 = check_in_range(betas[0], f"{name}[0]", 0.0, 1.0, high_open=True)
    b2 = check_in_range(betas[1], f"{name}[1]", 0.0, 1.0, high_open=True)
    return b1, b2


# ----------------------------------------------------------------------------- torchsso VOGN

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


def _s_like(x, name: str):
    if hasattr(x, "shape"):
        check_array(x, name, ndim=1)
        check_float(x, name)
        return x
    return check_in_range(x, name, -INF, INF, low_open=True, high_open=True)


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


# ----------------------------------------------------------------------------- emtiyaz/vadam

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


# ----------------------------------------------------------------------------- swa_gaussian

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
    _fixed(dampening, "dampening", (0.0,), "(swag.9) is the undampened heavy ball")
    _fixed(nesterov, "nesterov", (False,), "(swag.9) is the heavy ball")
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
        Must be False: ``sample_blockwise`` multiplies the covariance by scale^2 (E1).

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
    _fixed(block, "block", (False,), "sample_blockwise scales the covariance by scale^2 (E1)")
    return swag.SWAGConfig(K=check_int(max_num_models, "max_num_models", low=1),
                           scale=_pos(scale, "scale"),
                           var_clamp=_nonneg(var_clamp, "var_clamp"))


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


# ----------------------------------------------------------------------------- laplace-torch

_LT_STRUCTURES = ("full", "diag")
_LT_SUBSETS = ("all", "last_layer")
_LT_LIKELIHOODS = ("regression", "classification")
_LT_BACKEND = {"ggn": "BackPackGGN", "ef": "BackPackEF", "hessian": "AsdlHessian"}


def _lt_curvature(backend) -> str:
    if not isinstance(backend, str):
        raise ValueError(f"backend: expected the backend class's name (str), got {backend!r}")
    if backend == "AsdlHessian":
        return "hessian"
    if backend.endswith("GGN"):
        return "ggn"
    if backend.endswith("EF"):
        return "ef"
    raise ValueError("backend: expected a laplace-torch backend name ending in 'GGN' or 'EF', "
                     f"or 'AsdlHessian', got {backend!r}")


def from_laplace_torch(*, likelihood, subset_of_weights, hessian_structure, prior_precision=1.0,
                       prior_mean=0.0, temperature=1.0,
                       backend="BackPackGGN") -> laplace.LaplaceConfig:
    """Convert laplace-torch ``Laplace(model, ...)`` keyword arguments to a LaplaceConfig.

    derivations/laplace.md, "Conventions of public implementations": structure and curvature
    as the backend ('...GGN' -> "ggn", '...EF' -> "ef", 'AsdlHessian' -> "hessian"), the same
    prior_precision and subset. Not a config field: ``sigma_noise`` is the model's
    noise_precision = 1 / sigma_noise^2. Refused: hessian_structure "kron" (laplace-torch has no
    W-b cross block, (laplace.24)), "lowrank", "gp"; temperature != 1 and prior_mean != 0
    (refbayes has neither); the EF for regression (laplace-torch's is 2 / tau times the EF of the
    log-likelihood; no config reproduces it).

    Parameters
    ----------
    likelihood : {"regression", "classification"}
        The likelihood (only used to refuse the regression EF).
    subset_of_weights : {"all", "last_layer"}
        Which parameters are random.
    hessian_structure : {"full", "diag"}
        The precision's structure.
    prior_precision : float, default 1.0
        Scalar prior precision > 0 (per tensor: ``laplace.expand_prior_precision``).
    prior_mean : float, default 0.0
        Must be 0.
    temperature : float, default 1.0
        Must be 1.
    backend : str, default "BackPackGGN"
        The backend class's name.

    Returns
    -------
    laplace.LaplaceConfig
        The config whose posterior precision and evidence are laplace-torch's.

    Raises
    ------
    ValueError
        If an argument is out of range or not representable.
    """
    _fixed(likelihood, "likelihood", _LT_LIKELIHOODS, "laplace-torch's likelihoods")
    _fixed(subset_of_weights, "subset_of_weights", _LT_SUBSETS, "the subsets refbayes has")
    _fixed(hessian_structure, "hessian_structure", _LT_STRUCTURES,
           "laplace-torch's 'kron' has no W-b cross block (laplace.24); no lowrank / gp")
    _fixed(prior_mean, "prior_mean", (0.0,), "refbayes' prior is centred at 0")
    _fixed(temperature, "temperature", (1.0,), "refbayes has no tempering")
    curvature = _lt_curvature(backend)
    if curvature == "ef" and likelihood == "regression":
        raise ValueError("backend: an EF backend with likelihood 'regression' is not mapped "
                         "(laplace-torch's regression EF is 2 / tau times refbayes' 'ef'; "
                         f"derivations/laplace.md), got {backend!r}")
    return laplace.LaplaceConfig(
        prior_precision=_scalar_prec(prior_precision, "prior_precision",
                                     "this mapping (per-tensor values: expand_prior_precision)"),
        structure=hessian_structure, curvature=curvature, subset=subset_of_weights)


def to_laplace_torch(cfg: laplace.LaplaceConfig, likelihood: str) -> dict:
    """Convert a LaplaceConfig to laplace-torch ``Laplace(model, ...)`` keyword arguments.

    The inverse of ``from_laplace_torch`` (backend 'BackPackGGN', 'BackPackEF' or
    'AsdlHessian'). Set ``sigma_noise`` = 1 / sqrt(noise_precision) from the model.

    Parameters
    ----------
    cfg : laplace.LaplaceConfig
        A config with structure "full" or "diag" and a scalar prior precision.
    likelihood : {"regression", "classification"}
        The model's likelihood.

    Returns
    -------
    dict
        Keyword arguments likelihood, subset_of_weights, hessian_structure, prior_precision,
        prior_mean, temperature, backend.

    Raises
    ------
    ValueError
        If cfg is not a LaplaceConfig, has structure "kron", an array prior precision, or the
        "ef" curvature for regression.
    """
    _config(cfg, laplace.LaplaceConfig)
    _fixed(likelihood, "likelihood", _LT_LIKELIHOODS, "laplace-torch's likelihoods")
    _fixed(cfg.structure, "cfg.structure", _LT_STRUCTURES,
           "laplace-torch's 'kron' has no W-b cross block (laplace.24)")
    _fixed(cfg.subset, "cfg.subset", _LT_SUBSETS, "laplace-torch's subsets")
    _fixed(cfg.curvature, "cfg.curvature", tuple(_LT_BACKEND), "the curvatures refbayes has")
    if cfg.curvature == "ef" and likelihood == "regression":
        raise ValueError("cfg.curvature: 'ef' with likelihood 'regression' is not mapped "
                         "(laplace-torch's regression EF is 2 / tau times refbayes' 'ef')")
    return {"likelihood": likelihood, "subset_of_weights": cfg.subset,
            "hessian_structure": cfg.structure,
            "prior_precision": _scalar_prec(cfg.prior_precision, "cfg.prior_precision",
                                            "this mapping"),
            "prior_mean": 0.0, "temperature": 1.0, "backend": _LT_BACKEND[cfg.curvature]}


# ----------------------------------------------------------------------------- SLANG repo BBB

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


# ----------------------------------------------------------------------------- registry

def _conv(name, library, method, derivation, summary):
    g = globals()
    return name, Convention(name, library, method, derivation, g[f"from_{name}"],
                            g[f"to_{name}"], summary)


CONVENTIONS: dict[str, Convention] = dict([
    _conv("pytorch_sso_vogn", "cybertronai/pytorch-sso torchsso.optim.VIOptimizer / VOGN", "vogn",
          "derivations/vogn.md#conventions-of-public-implementations",
          "N = dataset_size, tau = kl_weighting, delta = 1/prior_variance, gamma = damping, "
          "beta2 = ema_decay, raw momentum or grad_ema_decay d -> beta1 = 1-d, alpha = lr d"),
    _conv("emtiyaz_vogn", "emtiyaz/vadam pytorch/vadam/optimizers.py VOGN", "vogn",
          "derivations/vogn.md#conventions-of-public-implementations",
          "delta = prior_prec, alpha = lr, beta2 = 1 - beta, beta1 = gamma = 0, tau = rho = 1"),
    _conv("emtiyaz_vadam", "emtiyaz/vadam pytorch/vadam/optimizers.py Vadam", "vadam",
          "derivations/vadam.md#conventions-of-public-implementations",
          "lam = prior_prec, alpha = lr, (beta1, beta2) = betas; s0 = (prec_init - lam) / N"),
    _conv("emtiyaz_vprop", "emtiyaz/vadam pytorch/vadam/optimizers.py Vprop", "vadam",
          "derivations/vadam.md#conventions-of-public-implementations",
          "vprop_config(N, prior_prec, alpha = lr, beta2 = beta)"),
    _conv("torch_sgd", "torch.optim.SGD (wjmaddox/swa_gaussian's base optimizer)", "swag",
          "derivations/swag.md#conventions-of-the-official-code-wjmaddoxswa_gaussian-at-82c9692",
          "alpha = lr / N, lam = N weight_decay, same momentum"),
    _conv("swa_gaussian", "wjmaddox/swa_gaussian swag.posteriors.SWAG", "swag",
          "derivations/swag.md#conventions-of-the-official-code-wjmaddoxswa_gaussian-at-82c9692",
          "K = max_num_models, same var_clamp, scale = sample_fullrank's scale"),
    _conv("laplace_torch", "aleximmer/Laplace laplace.Laplace", "laplace",
          "derivations/laplace.md#conventions-of-public-implementations",
          "same prior_precision, structure (full/diag) and subset; curvature from the backend"),
    _conv("slang_bbb", "aaronpmishkin/SLANG BBB baseline (torch.optim.Adam on F_hat / N)", "bbb",
          "derivations/bbb.md#conventions-of-public-implementations",
          "alpha = lr, betas, eps_adam = N eps, lam = prior_prec, kl_weight = 1"),
])
