"""IVON (Shen et al. 2024, "Variational learning is effective for large deep networks", ivon-opt):
a NumPy conformance reference of its step, its reduction to refbayes' VOGN, and the report.

Implements (vogn.13)-(vogn.19) of derivations/vogn.md, section "IVON".  IVON is NOT a special
case of refbayes.methods.vogn: its curvature estimate is the reparameterisation (Price / Stein)
estimator ghat_k eps_k / sigma of E_q[diag Hessian], signed, not a GGN or EF diagonal; its h
update adds the Riemannian correction (1 - beta2)^2 (h - f)^2 / (2 (h + wd)); its momentum is
an exponential average without the prior term, debiased, with the prior (weight decay) added
at the mean update; its step size is rescaled by hess_init + wd.  What coincides, with
N = ess, delta = ess wd (delta~ = wd), tau = rho = 1, gamma = 0, s = h: the Gaussian (vogn.4)
and, for beta1 = 0 and no clipping, the whole step, as VOGN (vogn.7)-(vogn.9) with alpha =
lr (hess_init + wd), beta2_VOGN = 1 - beta2 and the curvature estimate
hhat~ = f + (1 - beta2)(h - f)^2 / (2 (h + wd)) (vogn.19).

Symbols: mu (D,) mean (IVON's parameter average); h (D,) Hessian estimate, per-example units;
m (D,) momentum; ess effective sample size (the N of the Gaussian's precision ess (h + wd));
wd weight decay (the prior precision per example); eps (D, S) the caller's standard-normal
draws, one column per MC sample.  Gradients are those of the MEAN minibatch loss
(1/M) sum_{i in B} l_i (ivon-opt's usage: a mean-reduced loss); nothing is drawn here.

Scaling: ghat and f are per-example (the mean loss); ess enters the Gaussian and the gradsq
estimate f = ess mean_k ghat_k^2 only; M enters only through the mean loss.
"""
from __future__ import annotations

import math
from importlib.metadata import version
from typing import Any, NamedTuple

import numpy as np

from refbayes._tolerances import rel_err
from refbayes.conformance import Report, classify, flat_params, torch_mlp, torch_order
from refbayes.datasets import make_logistic_regression
from refbayes.methods import vogn
from refbayes.models import MLP

__all__ = ["HESS_APPROX", "IVONConfig", "IVONInfo", "IVONState", "init", "report", "sigma",
           "step", "vogn_config", "vogn_curvature"]

Array = Any
HESS_APPROX = ("price", "gradsq")


class IVONConfig(NamedTuple):
    """IVON hyperparameters, named as ivon-opt's ``IVON`` arguments, with its defaults.

    Attributes
    ----------
    lr : float
        Learning rate > 0.  (vogn.18)
    ess : float
        Effective sample size > 0, the N of the precision ess (h + wd).  (vogn.13)
    hess_init : float
        Initial h > 0; also rescales the step size.  (vogn.18)
    beta1 : float
        Momentum rate in [0, 1].  (vogn.16)
    beta2 : float
        Hessian running-average rate in [0, 1], the weight of the OLD h.  (vogn.17)
    weight_decay : float
        Weight decay wd >= 0: the prior precision per example.  (vogn.13), (vogn.18)
    clip_radius : float
        Elementwise clip of the preconditioned direction, > 0 (inf: none).  (vogn.18)
    debias : bool
        Divide m by 1 - beta1^t.  (vogn.18)
    rescale_lr : bool
        Step size lr (hess_init + wd) instead of lr.  (vogn.18)
    hess_approx : {"price", "gradsq"}
        The curvature estimate f.  (vogn.15)
    """
    lr: float                    # learning rate (vogn.18)
    ess: float                   # effective sample size, N of the precision (vogn.13)
    hess_init: float = 1.0       # h_0, also rescales lr (vogn.18)
    beta1: float = 0.9           # momentum rate (vogn.16)
    beta2: float = 0.99999       # weight of the old h (vogn.17)
    weight_decay: float = 1e-4   # wd, prior precision per example (vogn.13), (vogn.18)
    clip_radius: float = math.inf  # elementwise clip of the direction (vogn.18)
    debias: bool = True          # m / (1 - beta1^t) (vogn.18)
    rescale_lr: bool = True      # step size lr (hess_init + wd) (vogn.18)
    hess_approx: str = "price"   # "price" (g eps / sigma) or "gradsq" (ess g^2) (vogn.15)


class IVONState(NamedTuple):
    """IVON state after t steps.

    Attributes
    ----------
    mu : array of shape (D,)
        Mean (ivon-opt's parameter average).  (vogn.18)
    m : array of shape (D,)
        Momentum, without the prior term.  (vogn.16)
    h : array of shape (D,)
        Hessian estimate, per-example units, h + wd > 0.  (vogn.17)
    t : int
        Number of steps taken.
    """
    mu: Array  # mu_t, (D,) (vogn.18)
    m: Array   # m_t, (D,) (vogn.16)
    h: Array   # h_t, (D,) (vogn.17)
    t: int     # steps taken


class IVONInfo(NamedTuple):
    """The named intermediates of one IVON step, by equation.

    Attributes
    ----------
    sigma : array of shape (D,)
        Standard deviation (ess (h_t + wd))^{-1/2}.  (vogn.13)
    theta : array of shape (D, S)
        Draws mu + sigma eps_k.  (vogn.13)
    g_k : array of shape (S, D)
        Gradient of the mean minibatch loss at each draw.  (vogn.14)
    g_hat : array of shape (D,)
        Mean over the draws.  (vogn.14)
    f : array of shape (D,)
        Curvature estimate (price: mean_k g_k eps_k / sigma; gradsq: ess mean_k g_k^2).
        (vogn.15)
    m : array of shape (D,)
        Momentum m_{t+1}.  (vogn.16)
    h : array of shape (D,)
        Hessian estimate h_{t+1}.  (vogn.17)
    step_size : float
        lr (hess_init + wd), or lr.  (vogn.18)
    direction : array of shape (D,)
        clip((m_{t+1} / debias + wd mu) / (h_{t+1} + wd)).  (vogn.18)
    mu : array of shape (D,)
        Mean mu_{t+1}.  (vogn.18)
    """
    sigma: Array      # (ess (h_t + wd))^{-1/2}, (D,) (vogn.13)
    theta: Array      # mu + sigma eps_k, (D, S) (vogn.13)
    g_k: Array        # grad of the mean minibatch loss at theta_k, (S, D) (vogn.14)
    g_hat: Array      # mean_k g_k, (D,) (vogn.14)
    f: Array          # curvature estimate, (D,) (vogn.15)
    m: Array          # m_{t+1}, (D,) (vogn.16)
    h: Array          # h_{t+1}, (D,) (vogn.17)
    step_size: float  # lr (hess_init + wd) or lr (vogn.18)
    direction: Array  # clipped preconditioned direction, (D,) (vogn.18)
    mu: Array         # mu_{t+1}, (D,) (vogn.18)


def _check_cfg(cfg) -> IVONConfig:
    if not isinstance(cfg, IVONConfig):  # the package's convention: bad input is a ValueError
        raise ValueError(f"cfg: expected an IVONConfig, got {type(cfg).__name__}")  # noqa: TRY004
    checks = (("lr", cfg.lr >= 0), ("ess", cfg.ess > 0), ("hess_init", cfg.hess_init > 0),
              ("beta1", 0 <= cfg.beta1 <= 1), ("beta2", 0 <= cfg.beta2 <= 1),
              ("weight_decay", cfg.weight_decay >= 0), ("clip_radius", cfg.clip_radius > 0),
              ("hess_approx", cfg.hess_approx in HESS_APPROX))
    for name, ok in checks:
        if not ok:
            raise ValueError(f"cfg.{name}: out of range (see IVONConfig), got "
                             f"{getattr(cfg, name)!r}")
    return cfg


def init(mu, cfg: IVONConfig) -> IVONState:
    """Create the initial IVONState: m = 0, h = hess_init, t = 0.

    Parameters
    ----------
    mu : numpy.ndarray of shape (D,)
        Initial mean, float.
    cfg : IVONConfig
        Hyperparameters (hess_init is read).

    Returns
    -------
    IVONState
        The state (mu, zeros, hess_init, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array or cfg is out of range.
    """
    cfg = _check_cfg(cfg)
    mu = np.asarray(mu)
    if mu.ndim != 1 or mu.dtype.kind != "f" or not np.all(np.isfinite(mu)):
        raise ValueError(f"mu: expected a finite float array of shape (D,), got {mu.shape} "
                         f"{mu.dtype}")
    return IVONState(mu.copy(), np.zeros_like(mu), np.full_like(mu, cfg.hess_init), 0)


def sigma(state: IVONState, cfg: IVONConfig):
    """Compute the standard deviation (ess (h + wd))^{-1/2} of IVON's Gaussian.  (vogn.13)

    Parameters
    ----------
    state : IVONState
        Current state.
    cfg : IVONConfig
        Hyperparameters (ess, weight_decay).

    Returns
    -------
    numpy.ndarray of shape (D,)
        sigma, the (vogn.4) sigma of VOGN with N = ess, delta~ = wd, s = h, tau = 1.
    """
    return 1.0 / np.sqrt(cfg.ess * (state.h + cfg.weight_decay))  # (vogn.13)


def step(state: IVONState, batch, eps, cfg: IVONConfig, model) -> tuple[IVONState, IVONInfo]:
    """Take one IVON step with the caller's draws (ivon-opt's ``_update``, in NumPy).

    (vogn.13)-(vogn.18).  Deterministic given its inputs.

    Parameters
    ----------
    state : IVONState
        Current state (mu, m, h, t).
    batch : tuple of numpy.ndarray
        The minibatch (X_B (M, n_in), y_B (M,)); its mean loss is differentiated.
    eps : numpy.ndarray of shape (D, S)
        Standard-normal draws, one column per MC sample (ivon-opt's ``mc_samples``).
    cfg : IVONConfig
        Hyperparameters.
    model : FlatModel
        A refbayes model with D parameters (``model.grad`` of the summed loss, divided by M).

    Returns
    -------
    state : IVONState
        The state after the step.
    info : IVONInfo
        The intermediates.

    Raises
    ------
    ValueError
        If cfg is out of range or eps is not a finite (D, S >= 1) array.
    """
    cfg = _check_cfg(cfg)
    X, y = batch
    mu, D = state.mu, state.mu.shape[0]
    eps = np.asarray(eps)
    if eps.ndim != 2 or eps.shape[0] != D or eps.shape[1] < 1 or not np.all(np.isfinite(eps)):
        raise ValueError(f"eps: expected a finite array of shape ({D}, S >= 1), got {eps.shape}")
    wd, b1, b2 = cfg.weight_decay, cfg.beta1, cfg.beta2
    sig = sigma(state, cfg)                                                   # (vogn.13)
    theta = mu[:, None] + sig[:, None] * eps                                  # (vogn.13)
    M, S = X.shape[0], eps.shape[1]
    g_k = np.stack([model.grad(theta[:, k], X, y) / M for k in range(S)])  # (vogn.14)
    g_hat = g_k.mean(axis=0)                                                  # (vogn.14)
    if cfg.hess_approx == "price":
        f = (g_k * eps.T).mean(axis=0) / sig                                  # (vogn.15)
    else:
        f = cfg.ess * (g_k * g_k).mean(axis=0)                                # (vogn.15)
    m = b1 * state.m + (1.0 - b1) * g_hat                                     # (vogn.16)
    riemann = 0.5 * (1.0 - b2) ** 2 * (state.h - f) ** 2 / (state.h + wd)    # (vogn.17)
    h = b2 * state.h + (1.0 - b2) * f + riemann                               # (vogn.17)
    t = state.t + 1
    debias = 1.0 - b1 ** t if cfg.debias else 1.0                             # (vogn.18)
    step_size = cfg.lr * (cfg.hess_init + wd) if cfg.rescale_lr else cfg.lr  # (vogn.18)
    r = cfg.clip_radius
    direction = np.clip((m / debias + wd * mu) / (h + wd), -r, r)             # (vogn.18)
    mu_new = mu - step_size * direction                                      # (vogn.18)
    info = IVONInfo(sig, theta, g_k, g_hat, f, m, h, step_size, direction, mu_new)
    return IVONState(mu_new, m, h, t), info


def vogn_config(cfg: IVONConfig, *, reduction: bool = True):
    """Map an IVON config to the VOGNConfig of the reduction (vogn.19).

    Parameters
    ----------
    cfg : IVONConfig
        An IVON config with beta1 = 0 for the step to reduce (the Gaussian reduces for any).
    reduction : bool, default True
        True: the mapping of (vogn.19) (N = ess, delta = ess wd, alpha = lr (hess_init + wd),
        beta2 = 1 - beta2_IVON).  False: the naive reading (delta = wd, alpha = lr), the "raw"
        comparison of the report.

    Returns
    -------
    refbayes.methods.vogn.VOGNConfig
        The VOGN config (tau = rho = 1, gamma = 0, beta1 = 0).
    """
    cfg = _check_cfg(cfg)
    alpha = cfg.lr * (cfg.hess_init + cfg.weight_decay) if cfg.rescale_lr and reduction else cfg.lr
    delta = cfg.ess * cfg.weight_decay if reduction else cfg.weight_decay
    return vogn.VOGNConfig(N=int(cfg.ess), delta=delta, alpha=alpha, beta1=0.0,
                           beta2=1.0 - cfg.beta2, gamma=0.0, tau=1.0, rho=1.0)


def vogn_curvature(h, f, cfg: IVONConfig):
    """Return the curvature estimate that makes VOGN's (vogn.8) IVON's (vogn.17).

    hhat~ = f + (1 - beta2)(h - f)^2 / (2 (h + wd)).  (vogn.19)

    Parameters
    ----------
    h : numpy.ndarray of shape (D,)
        IVON's h_t.
    f : numpy.ndarray of shape (D,)
        The step's curvature estimate (vogn.15).
    cfg : IVONConfig
        Hyperparameters (beta2, weight_decay).

    Returns
    -------
    numpy.ndarray of shape (D,)
        hhat~, signed (VOGN's own estimates are >= 0).
    """
    return f + 0.5 * (1.0 - cfg.beta2) * (h - f) ** 2 / (h + cfg.weight_decay)  # (vogn.19)


# ----------------------------------------------------------------------------- the report

N_ROWS, P_FEATURES, HIDDEN, M_BATCH, S_DRAWS, K_STEPS = 64, 3, 4, 16, 2, 6
CONFIGS = {
    "defaults": IVONConfig(lr=0.05, ess=N_ROWS, hess_init=0.5),
    "gradsq": IVONConfig(lr=0.05, ess=N_ROWS, hess_init=0.5, beta2=0.9, hess_approx="gradsq"),
    "beta1=0": IVONConfig(lr=0.1, ess=N_ROWS, hess_init=0.5, beta1=0.0, beta2=0.7,
                          weight_decay=1.0 / N_ROWS),
}


def _run_torch_and_reference(cfg: IVONConfig, seed: int = 0) -> dict:
    """Drive ivon-opt and ``step`` side by side for K_STEPS steps on the same draws.

    Returns per-step arrays (refbayes order) of both sides and of the VOGN reduction.
    """
    import torch
    import torch.nn.functional as F
    from ivon import IVON

    data = make_logistic_regression(N_ROWS, P_FEATURES, seed)
    model = MLP([P_FEATURES, HIDDEN, 1], activation="tanh", likelihood="bernoulli")
    rng = np.random.default_rng(seed)
    theta0 = model.init_theta(rng, dtype=np.float64)
    perm = torch_order(model.sizes)
    inv = np.argsort(perm)
    net = torch_mlp(model, theta0)
    torch.manual_seed(seed)
    opt = IVON(net.parameters(), lr=cfg.lr, ess=cfg.ess, hess_init=cfg.hess_init,
               beta1=cfg.beta1, beta2=cfg.beta2, weight_decay=cfg.weight_decay,
               mc_samples=S_DRAWS, hess_approx=cfg.hess_approx, clip_radius=cfg.clip_radius,
               debias=cfg.debias, rescale_lr=cfg.rescale_lr)
    group = opt.param_groups[0]
    state = init(theta0, cfg)
    out = {k: [] for k in ("sigma_t", "eps", "eps_replay", "theta_t", "theta_r", "m_t", "m_r", "h_t",
                           "h_r", "mu_t", "mu_r", "vogn_sigma", "vogn_sigma_raw", "vogn_mu",
                           "vogn_mu_raw", "vogn_s", "vogn_s_raw", "vogn_m", "vogn_m_raw")}
    for _ in range(K_STEPS):
        idx = rng.choice(N_ROWS, M_BATCH, replace=False)
        Xb, yb = data.X[idx], data.y[idx]
        Xt, yt = torch.from_numpy(Xb), torch.from_numpy(yb)
        mu_t = flat_params(net)
        sig_t = 1.0 / np.sqrt(cfg.ess * (group["hess"].numpy() + cfg.weight_decay))
        eps, replay, thetas = [], [], []
        for _k in range(S_DRAWS):
            before = torch.get_rng_state()
            with opt.sampled_params(train=True):
                after = torch.get_rng_state()
                th = flat_params(net)
                opt.zero_grad()
                F.binary_cross_entropy_with_logits(net(Xt).reshape(-1), yt,
                                                   reduction="mean").backward()
            # the draw the optimizer made, read back from the sampled parameters ...
            eps.append(((th - mu_t) / sig_t)[inv])
            thetas.append(th[inv])
            # ... and, as a check of that reading, replayed from the generator
            torch.set_rng_state(before)
            replay.append(torch.randn(mu_t.size, dtype=torch.float64).numpy()[inv])
            torch.set_rng_state(after)
        opt.step()
        E = np.stack(eps, axis=1)
        prev = state
        state, info = step(state, (Xb, yb), E, cfg, model)
        out["sigma_t"].append(sig_t[inv])
        out["eps"].append(E)
        out["eps_replay"].append(np.stack(replay, axis=1))
        out["theta_t"].append(np.stack(thetas, axis=1))
        out["theta_r"].append(info.theta)
        for key, torch_value, ref in (("m", group["momentum"], state.m),
                                      ("h", group["hess"], state.h), ("mu", None, state.mu)):
            tv = flat_params(net) if torch_value is None else torch_value.numpy().copy()
            out[f"{key}_t"].append(tv[inv])
            out[f"{key}_r"].append(ref)
        if cfg.beta1 == 0.0 and math.isinf(cfg.clip_radius):
            # the reduction (vogn.19): VOGN's own functions on IVON's estimates
            for suffix, reduction, hhat in (("", True, vogn_curvature(prev.h, info.f, cfg)),
                                            ("_raw", False, info.f)):
                vcfg = vogn_config(cfg, reduction=reduction)
                vs = vogn.VOGNState(prev.mu, prev.h, np.zeros_like(prev.mu), prev.t)
                # IVON's Hessian estimate is signed; VOGN's own GGN / EF estimates are >= 0
                new, vinfo = vogn.apply(vs, info.g_hat, hhat, vcfg, signed=True)
                sig_v = vinfo.sigma
                out["vogn_sigma" + suffix].append(sig_v)
                out["vogn_mu" + suffix].append(new.mu)
                out["vogn_s" + suffix].append(new.s)
                # IVON's m has no prior term: VOGN m - delta~ mu (mapped)
                out["vogn_m" + suffix].append(vinfo.m - vinfo.delta_tilde * prev.mu if reduction
                                              else vinfo.m)
    return {k: np.array(v) for k, v in out.items()}


def _config_rows(rows, name: str, cfg: IVONConfig):
    r = _run_torch_and_reference(cfg)
    label = f"{name}: "
    rows.append(classify(label + "eps read back from the sampled parameters vs generator replay",
                         rel_err(r["eps"], r["eps_replay"])))
    for key, what in (("theta", "draws mu + sigma eps (vogn.13)"), ("m", "momentum (vogn.16)"),
                      ("h", "Hessian estimate h (vogn.17)"), ("mu", "mean (vogn.18)")):
        rows.append(classify(f"{label}{what}, {K_STEPS} steps",
                             rel_err(r[f"{key}_r"], r[f"{key}_t"])))
    if r["vogn_mu"].size:
        mapping = (f"(vogn.19) N = ess, delta = ess wd = {cfg.ess * cfg.weight_decay:g} "
                   f"(raw: delta = wd)")
        rows.append(classify(f"{label}VOGN sigma (vogn.4) vs IVON's",
                             rel_err(r["vogn_sigma"], r["sigma_t"]),
                             raw_error=rel_err(r["vogn_sigma_raw"], r["sigma_t"]), note=mapping))
        rows.append(classify(f"{label}VOGN m (vogn.7) vs IVON m", rel_err(r["vogn_m"], r["m_t"]),
                             raw_error=rel_err(r["vogn_m_raw"], r["m_t"]),
                             note="(vogn.19) IVON's m has no prior term: m_VOGN - delta~ mu"))
        rows.append(classify(f"{label}VOGN s (vogn.8) vs IVON h", rel_err(r["vogn_s"], r["h_t"]),
                             raw_error=rel_err(r["vogn_s_raw"], r["h_t"]),
                             note="(vogn.19) beta2_VOGN = 1 - beta2; hhat = f + (1 - beta2)"
                                  "(h - f)^2 / (2 (h + wd)), IVON's Riemannian term "
                                  "(raw: hhat = f)"))
        rows.append(classify(f"{label}VOGN mu (vogn.9) vs IVON mu", rel_err(r["vogn_mu"], r["mu_t"]),
                             raw_error=rel_err(r["vogn_mu_raw"], r["mu_t"]),
                             note="(vogn.19) alpha = lr (hess_init + wd), delta = ess wd, hhat "
                                  "as above (raw: alpha = lr, delta = wd, hhat = f)"))


def report() -> Report:
    """Run ivon-opt's IVON and the NumPy reference on the same draws and classify the rows.

    Returns
    -------
    Report
        Per config (ivon-opt's defaults; gradsq with beta2 = 0.9; beta1 = 0, beta2 = 0.7):
        the draws, m, h and mu after each of K_STEPS steps; for beta1 = 0 also the
        reduction to VOGN (vogn.19).
    """
    import torch
    rows = []
    for name, cfg in CONFIGS.items():
        _config_rows(rows, name, cfg)
    title = (f"ivon-opt {version('ivon-opt')}, torch {torch.__version__}, float64; MLP "
             f"[{P_FEATURES}, {HIDDEN}, 1] tanh, Bernoulli, make_logistic_regression(N = "
             f"{N_ROWS}), mean loss over M = {M_BATCH} rows, mc_samples = {S_DRAWS}, "
             f"{K_STEPS} steps, ess = N")
    return Report("ivon", title, rows)
