"""refbayes.conventions: public hyperparameters <-> refbayes configs.

For each mapping: (1) the public library's update written out in plain NumPy with ITS variables
and scaling (the mean loss, its precision / prior-variance / weight-decay parameterisation, as
the derivation note's conventions table states them) and run with the public hyperparameters,
against the refbayes step with the mapped config, on the same inputs and draws; (2) exact round
trips both ways; (3) bad and non-representable inputs raise ValueError naming the argument.
"""
from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refbayes import conventions as cv
from refbayes.datasets import make_logistic_regression
from refbayes.linalg import kron
from refbayes.methods import bbb, laplace, swag, vadam, vogn
from refbayes.methods import noisy_kfac as nk
from refbayes.methods._estimates import Batch
from refbayes.models import MLP, LogisticRegression
from tests.reference.per_example import (
    example_loss,
    jacobian_loop,
    per_example_grads_loop,
    spec_of,
)
from tests.tolerances import EXACT_F64, assert_close

N, P, M, S = 30, 3, 7, 2
ROOT = Path(__file__).resolve().parent.parent


def _logistic(seed=0):
    s = make_logistic_regression(N, P, seed)
    return s.X, s.y.astype(float), LogisticRegression(P)


def _plan(D, steps, seed=5, K=S):
    rng = np.random.default_rng(seed)
    return [(rng.permutation(N)[:M], rng.standard_normal((D, K))) for _ in range(steps)]


def _mean_grads(model, theta, X, y):
    """Per-example gradients (M, D) of -log p, by autograd one example at a time (a public
    library's closure backpropagates the minibatch MEAN of these)."""
    return per_example_grads_loop(spec_of(model), theta, X, y)


# ----------------------------------------------------------------------------- torchsso VOGN

def _torchsso_steps(kw, p0, mean0, X, y, model, plan):
    """torchsso VIOptimizer.step (derivations/vogn.md, conventions table), written out:
    std = sqrt(kl / N) / sqrt(ema + damping + l2_ema) with the OLD curvature; per draw the
    minibatch-MEAN gradient and the mean of the per-example squares ('Cov', 'Diag'), averaged
    over the draws; l2_reg mean added to the raw gradient; raw momentum (buf <- b buf + grad)
    or gradient EMA (buf <- (1 - d) buf + d grad); ema <- (1 - e) ema + e data and the prior's
    own running average l2_ema <- (1 - e) l2_ema + e l2_reg, started at init_precision and 0;
    mean <- mean - lr buf / (ema + l2_ema + damping)."""
    Nd, lr, kl = kw["dataset_size"], kw["lr"], kw["kl_weighting"]
    e, damp = kw["curv_kwargs"]["ema_decay"], kw["curv_kwargs"]["damping"]
    l2_reg = kl / Nd / kw["prior_variance"]
    std_scale = np.sqrt(kl / Nd)
    mean, ema = mean0.copy(), np.full_like(mean0, p0)
    l2_ema, buf = np.zeros_like(mean0), np.zeros_like(mean0)
    for idx, eps in plan:
        std = std_scale / np.sqrt(ema + damp + l2_ema)
        K = eps.shape[1]
        grad, data = np.zeros_like(mean), np.zeros_like(mean)
        for k in range(K):
            G = _mean_grads(model, mean + std * eps[:, k], X[idx], y[idx])
            grad += G.mean(axis=0) / K
            data += (G ** 2).mean(axis=0) / K
        grad = grad + l2_reg * mean
        if kw.get("grad_ema_decay", 1.0) < 1.0:
            d = kw["grad_ema_decay"]
            buf = (1 - d) * buf + d * grad
        else:
            buf = kw["momentum"] * buf + grad
        ema = (1 - e) * ema + e * data
        l2_ema = (1 - e) * l2_ema + e * l2_reg
        mean = mean - lr * buf / (ema + l2_ema + damp)
    return mean, ema + l2_ema + damp


@pytest.mark.parametrize("form", ["raw_momentum", "grad_ema"])
def test_pytorch_sso_vogn_takes_the_same_steps(form):
    X, y, model = _logistic()
    kw = {"dataset_size": N, "lr": 0.3, "kl_weighting": 0.7, "prior_variance": 2.5,
          "curv_kwargs": {"ema_decay": 0.3, "damping": 0.01}}
    if form == "raw_momentum":
        kw.update(momentum=0.6, momentum_type="raw")
    else:
        kw.update(grad_ema_decay=0.25)
    p0 = 1.5
    cfg = cv.from_pytorch_sso_vogn(**kw)
    mu0 = 0.3 * np.random.default_rng(1).standard_normal(model.D)
    plan = _plan(model.D, 3)
    mean, prec_sum = _torchsso_steps(kw, p0, mu0, X, y, model, plan)
    state = vogn.init(mu0, np.full(model.D, cv.s0_from_pytorch_sso_init_precision(p0, cfg)))
    for idx, eps in plan:
        state, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
    assert_close(state.mu, mean, EXACT_F64, "mean after 3 steps")
    # the precision: torchsso (N / kl)(ema + l2_ema + damping)
    assert_close(vogn.prec_diag(state, cfg), (N / 0.7) * prec_sum, EXACT_F64, "precision")


# ----------------------------------------------------------------------------- torchsso Noisy K-FAC

def _torchsso_kron_steps(kw, mean0, X, y, model, plan):
    """torchsso VIOptimizer.step with Kron 'Cov' curvature (derivations/noisy_kfac.md,
    "Conventions of torchsso"), written out in refbayes' layer layout W~ (n_in + 1, n_out):
    the first step at the mean, later ones at the plan's draws; per draw the minibatch-MEAN
    gradient and the factors a~ a~^T / M, g g^T / M, averaged over the draws; l2_reg mean added
    to the raw gradient; ema <- the first statistics, then e data + (1 - e) ema; damping +
    l2_reg split by pi; the solve with this step's factors; weight_decay mean added to the
    preconditioned gradient; buf <- momentum buf + that; mean <- mean - lr buf. momentum_type
    'raw': buf <- momentum buf + the raw gradient, solved; mean <- mean - lr (that + weight_decay
    mean)."""
    Nd, lr, kl = kw["dataset_size"], kw["lr"], kw["kl_weighting"]
    e, damp = kw["curv_kwargs"]["ema_decay"], kw["curv_kwargs"]["damping"]
    l2_reg = kl / Nd / kw["prior_variance"]
    blocks = nk.layer_slices(model)
    mean, buf, ema = mean0.copy(), np.zeros_like(mean0), None
    for idx, Z in plan:
        W = mean[:, None] + (0.0 if Z is None else Z)
        grad = np.mean([_mean_grads(model, W[:, s], X[idx], y[idx]).mean(axis=0)
                        for s in range(W.shape[1])], axis=0) + l2_reg * mean
        data = []
        for l in range(len(blocks)):
            Ah = Gh = 0.0
            for s in range(W.shape[1]):
                layer = model.kfac_factors(W[:, s], X[idx], y[idx])[l]
                a = np.hstack([layer.a, np.ones((len(idx), 1))])
                Ah = Ah + a.T @ a / len(idx) / W.shape[1]
                Gh = Gh + layer.g.T @ layer.g / len(idx) / W.shape[1]
            data.append((Ah, Gh))
        ema = data if ema is None else [(e * Ah + (1 - e) * A, e * Gh + (1 - e) * G)
                                        for (Ah, Gh), (A, G) in zip(data, ema)]
        r = np.sqrt(damp + l2_reg)
        raw = kw.get("momentum_type", "preconditioned") == "raw"
        if raw:
            buf = kw["momentum"] * buf + grad
        v, P = (buf if raw else grad), np.empty_like(mean)
        for (a0, b0, n_a, n_b), (A, G) in zip(blocks, ema):
            pi = np.sqrt((np.trace(A) / n_a) / (np.trace(G) / n_b))
            A_inv = np.linalg.inv(A + r * pi * np.eye(n_a))
            G_inv = np.linalg.inv(G + r / pi * np.eye(n_b))
            P[a0:b0] = (A_inv @ v[a0:b0].reshape(n_a, n_b) @ G_inv).ravel()
        if raw:
            mean = mean - lr * (P + kw["weight_decay"] * mean)
        else:
            buf = kw["momentum"] * buf + (P + kw["weight_decay"] * mean)
            mean = mean - lr * buf
    return mean, buf, ema


@pytest.mark.parametrize("momentum_type", ["preconditioned", "raw"])
def test_pytorch_sso_noisy_kfac_takes_the_same_steps(momentum_type):
    """torchsso's Noisy K-FAC written out (above) against noisy_kfac.step with the mapped config:
    the first step as eps=None with beta = 1 (torchsso's has no draws and no start factors),
    then antithetic draw pairs (torchsso's prior term is at the mean, refbayes' at the draws:
    they agree when the draws average to the mean), handed to refbayes through the inverse of
    the sampling map (noisy_kfac.7); both momentum types. The real torchsso:
    tools/torchsso_noisy_kfac_check.py."""
    model = MLP([3, 4, 3], "tanh", "categorical")
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((N, 3)), rng.integers(0, 3, N)
    kw = {"dataset_size": N, "curv_type": "Cov", "curv_shapes": {"Linear": "Kron"},
          "curv_kwargs": {"ema_decay": 0.3, "damping": 0.05}, "lr": 0.1, "momentum": 0.9,
          "kl_weighting": 0.7, "prior_variance": 0.5, "weight_decay": 0.2,
          "momentum_type": momentum_type}
    cfg = cv.from_pytorch_sso_noisy_kfac(**kw)
    assert cfg.momentum_type == cv.to_pytorch_sso_noisy_kfac(cfg)["momentum_type"] == momentum_type
    plan = [(rng.permutation(N)[:M], None)]
    for _ in range(3):
        z = 0.05 * rng.standard_normal((model.D, 1))
        plan.append((rng.permutation(N)[:M], np.hstack([z, -z])))
    mu0 = model.init_theta(rng)
    mean, buf, ema = _torchsso_kron_steps(kw, mu0, X, y, model, plan)
    state = nk.init(mu0, model)
    g_s = nk.gamma_in(cfg) + cfg.gamma_ex  # the "full" sampler's damping
    for t, (idx, Z) in enumerate(plan):
        if Z is None:
            state, _ = nk.step(state, Batch(X[idx], y[idx]), None, cfg._replace(beta=1.0),
                               model)
            continue
        eps = np.empty_like(Z)
        for (a0, b0, n_a, n_b), A, G in zip(nk.layer_slices(model), state.A_ref, state.S_ref):
            L_A, L_S = kron.factored_chol(A, G, g_s)   # eps = L_A^T Z L_S / sqrt(lam / N)
            for s in range(Z.shape[1]):
                eps[a0:b0, s] = (L_A.T @ Z[a0:b0, s].reshape(n_a, n_b) @ L_S).ravel()
        eps /= np.sqrt(cfg.kl_weight / cfg.N)
        before = state.mu
        state, info = nk.step(state, Batch(X[idx], y[idx]), eps, cfg, model)
        assert_close(info.w, before[:, None] + Z, EXACT_F64, f"step {t + 1}'s draws")
    assert_close(state.mu, mean, EXACT_F64, "mean after 4 steps")
    assert_close(state.m, buf, EXACT_F64, "momentum buffer")
    for l, (A, G) in enumerate(ema):
        assert_close(state.A[l], A, EXACT_F64, f"A[{l}]")
        assert_close(state.S[l], G, EXACT_F64, f"G[{l}]")


# ----------------------------------------------------------------------------- emtiyaz/vadam

def test_emtiyaz_vogn_takes_the_same_steps():
    """emtiyaz/vadam VOGN: Precision P (summed units) starts at prec_init; draws
    mu + eps / sqrt(P); N times the minibatch means of the gradient and of the per-example
    squares, averaged over draws; P <- beta P + (1 - beta)(GGN + prior_prec);
    mu <- mu - lr (grad + prior_prec mu) / P."""
    X, y, model = _logistic(1)
    kw = {"train_set_size": N, "lr": 0.4, "beta": 0.6, "prior_prec": 2.0, "num_samples": S}
    prec_init = 5.0
    cfg = cv.from_emtiyaz_vogn(**kw)
    mu0 = 0.2 * np.random.default_rng(2).standard_normal(model.D)
    plan = _plan(model.D, 3)
    mu, Prec = mu0.copy(), np.full(model.D, prec_init)
    for idx, eps in plan:
        grad, ggn = np.zeros(model.D), np.zeros(model.D)
        for k in range(S):
            G = _mean_grads(model, mu + eps[:, k] / np.sqrt(Prec), X[idx], y[idx])
            grad += G.sum(axis=0) / M
            ggn += (G ** 2).sum(axis=0) / M
        grad, ggn = grad * N / S, ggn * N / S
        Prec = Prec * kw["beta"] + (ggn + kw["prior_prec"]) * (1 - kw["beta"])
        mu = mu - kw["lr"] * (grad + kw["prior_prec"] * mu) / Prec
    state = vogn.init(mu0, np.full(model.D, cv.s0_from_emtiyaz_prec_init(prec_init, cfg)))
    for idx, eps in plan:
        state, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
    assert_close(state.mu, mu, EXACT_F64, "mu")
    assert_close(vogn.prec_diag(state, cfg), Prec, EXACT_F64, "Precision")


def _emtiyaz_adaptive(kw, prec_init, mu0, X, y, model, plan, vprop):
    """emtiyaz/vadam Vadam / Vprop: exp_avg_sq starts at (prec_init - prior_prec) / N; draws
    mu + eps / sqrt(N exp_avg_sq + prior_prec); per draw the gradient of the minibatch-MEAN loss
    and its square, averaged over draws; tlambda = prior_prec / N; Vadam: exp_avg <- b1 exp_avg
    + (1 - b1)(grad + tlambda mu), exp_avg_sq <- b2 exp_avg_sq + (1 - b2) grad2, both
    bias-corrected with the 1-based step, denominator sqrt(.) + tlambda; Vprop: no exp_avg, no
    bias correction, numerator grad + tlambda mu."""
    Nn, lam, lr = kw["train_set_size"], kw["prior_prec"], kw["lr"]
    tl = lam / Nn
    mu = mu0.copy()
    exp_avg = np.zeros_like(mu)
    exp_avg_sq = np.full_like(mu, (prec_init - lam) / Nn)
    for step, (idx, eps) in enumerate(plan, start=1):
        grad, grad2 = np.zeros_like(mu), np.zeros_like(mu)
        K = eps.shape[1]
        for k in range(K):
            g = _mean_grads(model, mu + eps[:, k] / np.sqrt(Nn * exp_avg_sq + lam),
                            X[idx], y[idx]).mean(axis=0)
            grad += g
            grad2 += g ** 2
        grad, grad2 = grad / K, grad2 / K
        if vprop:
            b = kw["beta"]
            exp_avg_sq = exp_avg_sq * b + (1 - b) * grad2
            mu = mu - lr * (grad + tl * mu) / (np.sqrt(exp_avg_sq) + tl)
        else:
            b1, b2 = kw["betas"]
            exp_avg = exp_avg * b1 + (1 - b1) * (grad + tl * mu)
            exp_avg_sq = exp_avg_sq * b2 + (1 - b2) * grad2
            num = exp_avg / (1 - b1 ** step)
            den = np.sqrt(exp_avg_sq / (1 - b2 ** step)) + tl
            mu = mu - lr * num / den
    return mu, Nn * exp_avg_sq + lam


@pytest.mark.parametrize("which", ["vadam", "vprop"])
def test_emtiyaz_vadam_and_vprop_take_the_same_steps(which):
    X, y, model = _logistic(2)
    if which == "vadam":
        kw = {"train_set_size": N, "lr": 0.05, "betas": (0.7, 0.8), "prior_prec": 1.5}
        cfg = cv.from_emtiyaz_vadam(**kw)
    else:
        kw = {"train_set_size": N, "lr": 0.05, "beta": 0.8, "prior_prec": 1.5}
        cfg = cv.from_emtiyaz_vprop(**kw)
    prec_init = 4.0
    mu0 = 0.2 * np.random.default_rng(3).standard_normal(model.D)
    plan = _plan(model.D, 3)
    mu, prec = _emtiyaz_adaptive(kw, prec_init, mu0, X, y, model, plan, which == "vprop")
    state = vadam.init(mu0, np.full(model.D, cv.s0_from_emtiyaz_prec_init(prec_init, cfg)))
    for idx, eps in plan:
        state, _ = vadam.step(state, vadam.Batch(X[idx], y[idx]), eps, cfg, model)
    assert_close(state.mu, mu, EXACT_F64, f"{which} mu")
    assert_close(vadam.prec_diag(state, cfg), prec, EXACT_F64, f"{which} precision")


# ----------------------------------------------------------------------------- swa_gaussian

def test_torch_sgd_takes_the_same_steps():
    """torch.optim.SGD on the minibatch-MEAN loss: d = grad + weight_decay theta; buf <-
    momentum buf + d (buf = d at the first step); theta <- theta - lr buf."""
    X, y, model = _logistic(3)
    kw = {"N": N, "lr": 0.5, "momentum": 0.9, "weight_decay": 0.02}
    cfg = cv.from_torch_sgd(**kw)
    theta0 = 0.5 * np.random.default_rng(4).standard_normal(model.D)
    plan = _plan(model.D, 4)
    theta, buf = theta0.copy(), None
    for idx, _ in plan:
        d = _mean_grads(model, theta, X[idx], y[idx]).mean(axis=0) + kw["weight_decay"] * theta
        buf = d.copy() if buf is None else kw["momentum"] * buf + d
        theta = theta - kw["lr"] * buf
    state = swag.sgd_init(theta0)
    for idx, _ in plan:
        state, _ = swag.sgd_step(state, swag.Batch(X[idx], y[idx]), None, cfg, model)
    assert_close(state.theta, theta, EXACT_F64, "theta after 4 steps")


def test_swa_gaussian_moments_and_sample_agree():
    """swa_gaussian collect_model (mean, sq_mean, cov_mat_sqrt rows: append theta - mean,
    drop row 0 beyond max_num_models) and sample_fullrank(scale): mean + sqrt(scale)
    (sqrt(clamp(var)) z1 + cov_mat_sqrt^T z2 / sqrt(max_num_models - 1)), buffer full."""
    kw = {"max_num_models": 3, "var_clamp": 1e-30, "scale": 0.5}
    cfg = cv.from_swa_gaussian(**kw)
    rng = np.random.default_rng(6)
    D, K = 5, kw["max_num_models"]
    snaps = rng.standard_normal((6, D))
    mean, sq_mean, rows = np.zeros(D), np.zeros(D), []
    for n, th in enumerate(snaps):
        mean = mean * n / (n + 1) + th / (n + 1)
        sq_mean = sq_mean * n / (n + 1) + th ** 2 / (n + 1)
        rows.append(th - mean)
        if len(rows) > K:
            rows.pop(0)
    C = np.array(rows)
    z1, z2 = rng.standard_normal((D, 2)), rng.standard_normal((K, 2))
    var = np.maximum(sq_mean - mean ** 2, kw["var_clamp"])
    official = mean[:, None] + np.sqrt(kw["scale"]) * (
        np.sqrt(var)[:, None] * z1 + C.T @ z2 / np.sqrt(K - 1))
    state = swag.init(np.zeros(D), cfg)
    for th in snaps:
        state, _ = swag.collect(state, th, cfg)
    assert_close(state.theta_bar, mean, EXACT_F64, "mean")
    assert_close(swag.sample(state, z1, z2, cfg), official, EXACT_F64, "sample_fullrank")


# ----------------------------------------------------------------------------- laplace-torch

def _regression_net(seed=7):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((12, 2))
    y = np.sin(X.sum(axis=1))
    sigma_noise = 0.5
    model = MLP([2, 3, 1], activation="tanh", likelihood="gaussian",
                noise_precision=1.0 / sigma_noise ** 2)
    return X, y, model, sigma_noise, model.init_theta(rng)


@pytest.mark.parametrize("structure", ["full", "diag"])
def test_laplace_torch_posterior_precision_agrees(structure):
    """laplace-torch: posterior_precision = _H_factor H_raw + prior_precision, H_raw the GGN of
    its raw loss MSE(sum) / 2 = sum_i J_i^T J_i, _H_factor = 1 / (sigma_noise^2 temperature)."""
    X, y, model, sigma_noise, theta = _regression_net()
    kw = {"likelihood": "regression", "subset_of_weights": "all",
          "hessian_structure": structure, "prior_precision": 0.7, "backend": "BackPackGGN"}
    cfg = cv.from_laplace_torch(**kw)
    J = jacobian_loop(spec_of(model), theta, X)
    H_raw = sum(J[i].T @ J[i] for i in range(len(X)))
    prec = H_raw / (sigma_noise ** 2 * 1.0) + kw["prior_precision"] * np.eye(model.D)
    state = laplace.fit(model, theta, X, y, cfg)
    ours = laplace.dense_precision(state)
    assert_close(ours, prec if structure == "full" else np.diag(np.diag(prec)), EXACT_F64,
                 f"{structure} precision")


def test_laplace_torch_classification_ef_agrees():
    """laplace-torch EF backend, classification: sum_i g_i g_i^T of the cross-entropy (sum),
    _H_factor = 1, plus the prior precision."""
    rng = np.random.default_rng(8)
    X = rng.standard_normal((10, 2))
    y = rng.integers(0, 3, 10)
    model = MLP([2, 3, 3], activation="tanh", likelihood="categorical")
    theta = model.init_theta(rng)
    cfg = cv.from_laplace_torch(likelihood="classification", subset_of_weights="all",
                                hessian_structure="full", prior_precision=2.0,
                                backend="BackPackEF")
    G = per_example_grads_loop(spec_of(model), theta, X, y)
    prec = G.T @ G + 2.0 * np.eye(model.D)
    assert_close(laplace.dense_precision(laplace.fit(model, theta, X, y, cfg)), prec,
                 EXACT_F64, "EF precision")


# ----------------------------------------------------------------------------- SLANG BBB

def test_slang_bbb_takes_the_same_steps():
    """SLANG's BBB baseline: torch Adam (eps added to sqrt(v) / sqrt(1 - b2^t)) on
    loss = -(1/N)[mean_s N mean_B log p(y | x, mu + softplus(rho) eps_s) - KL], the KL to
    N(0, 1 / prior_prec) in closed form."""
    X, y, model = _logistic(4)
    spec = spec_of(model)
    D = model.D
    prior = np.linspace(0.5, 2.0, D)
    kw = {"train_set_size": N, "prior_prec": prior, "lr": 0.01, "betas": (0.9, 0.99),
          "eps": 1e-4}  # large enough that eps_adam = N eps is tested
    cfg = cv.from_slang_bbb(**kw)
    plan = _plan(D, 3)

    def loss(w, idx, eps):
        mu, rho = w[:D], w[D:]
        sigma = anp.log1p(anp.exp(rho))
        lik = 0.0
        for k in range(eps.shape[1]):
            th = mu + sigma * eps[:, k]
            lik = lik - sum(example_loss(spec, th, X[i], y[i]) for i in idx) / len(idx)
        lik = N * lik / eps.shape[1]
        kl = 0.5 * anp.sum(prior * sigma ** 2 + prior * mu ** 2 - 1 - anp.log(prior * sigma ** 2))
        return -(lik - kl) / N

    grad = autograd.grad(loss)
    mu0 = 0.1 * np.random.default_rng(9).standard_normal(D)
    w = np.concatenate([mu0, -np.ones(D)])
    m, v = np.zeros(2 * D), np.zeros(2 * D)
    b1, b2 = kw["betas"]
    for t, (idx, eps) in enumerate(plan, start=1):
        g = grad(w, idx, eps)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - kw["lr"] / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + kw["eps"])
    state = bbb.init(mu0, rho0=-1.0)
    for idx, eps in plan:
        state, _ = bbb.step(state, bbb.Batch(X[idx], y[idx]), eps, cfg, model)
    assert_close(state.mu, w[:D], EXACT_F64, "mu")
    assert_close(state.rho, w[D:], EXACT_F64, "rho")


# ----------------------------------------------------------------------------- round trips

PUBLIC = {
    "pytorch_sso_vogn": dict(dataset_size=500, lr=1e-4, momentum=0.9, momentum_type="raw",
                             grad_ema_decay=1.0, grad_ema_type="raw", curv_type="Cov",
                             curv_kwargs={"ema_decay": 0.001, "damping": 1e-3},
                             kl_weighting=1.0, warmup_kl_weighting_steps=None,
                             prior_variance=0.02),
    "pytorch_sso_noisy_kfac": dict(dataset_size=50000, curv_type="Fisher",
                                   curv_shapes={"Linear": "Kron", "Conv2d": "Kron"},
                                   curv_kwargs={"ema_decay": 0.333, "damping": 1e-4,
                                                "pi_type": "tracenorm"},
                                   lr=4e-3, momentum=0.9, momentum_type="preconditioned",
                                   kl_weighting=0.2, warmup_kl_weighting_steps=None,
                                   prior_variance=1.0, weight_decay=0.1),
    "emtiyaz_vogn": dict(train_set_size=100, lr=1e-3, beta=0.999, prior_prec=1.0),
    "emtiyaz_vadam": dict(train_set_size=100, lr=0.01, betas=(0.9, 0.99), prior_prec=3.0),
    "emtiyaz_vprop": dict(train_set_size=100, lr=0.01, beta=0.99, prior_prec=3.0),
    "torch_sgd": dict(N=50, lr=0.1, momentum=0.9, weight_decay=0.02, dampening=0.0,
                      nesterov=False),
    "swa_gaussian": dict(max_num_models=20, var_clamp=1e-30, scale=0.5, no_cov_mat=False,
                         block=False),
    "laplace_torch": dict(likelihood="regression", subset_of_weights="last_layer",
                          hessian_structure="full", prior_precision=1.0, prior_mean=0.0,
                          temperature=1.0, backend="BackPackGGN"),
    "slang_bbb": dict(train_set_size=300, prior_prec=2.0, lr=0.01, betas=(0.9, 0.99), eps=1e-8,
                      weight_decay=0.0, amsgrad=False),
}


def _to(name, cfg, kw):
    conv = cv.CONVENTIONS[name]
    return conv.from_refbayes(cfg, kw["likelihood"]) if name == "laplace_torch" else \
        conv.from_refbayes(cfg)


def _equal(a, b, what):
    if isinstance(a, dict):
        assert set(a) == set(b), what
        for k in a:
            _equal(a[k], b[k], f"{what}.{k}")
    elif isinstance(a, (tuple, list)) and not hasattr(a, "_fields"):
        assert len(a) == len(b), what
        for i, (x, z) in enumerate(zip(a, b)):
            _equal(x, z, f"{what}[{i}]")
    elif hasattr(a, "_fields"):
        assert type(a) is type(b), what
        for f in a._fields:
            _equal(getattr(a, f), getattr(b, f), f"{what}.{f}")
    elif isinstance(a, (float, np.ndarray)) and not isinstance(a, bool):
        assert_close(np.asarray(a, float), np.asarray(b, float), EXACT_F64, what)
    else:
        assert a == b and type(a) is type(b), f"{what}: {a!r} != {b!r}"


def test_registry_lists_every_pair():
    names = {n[len("from_"):] for n in cv.__all__ if n.startswith("from_")}
    assert set(cv.CONVENTIONS) == names == set(PUBLIC)
    for name, c in cv.CONVENTIONS.items():
        assert c.name == name and c.to_refbayes is getattr(cv, f"from_{name}")
        assert c.from_refbayes is getattr(cv, f"to_{name}")
        importlib.import_module(f"refbayes.methods.{c.method}")
        path, _, anchor = c.derivation.partition("#")
        text = (ROOT / path).read_text().lower()
        assert anchor and "conventions" in anchor
        assert f"from_{name}" in text and f"to_{name}" in text, f"{path} names the pair"
        assert c.summary and "\n" not in c.summary


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_round_trip_from_public(name):
    kw = PUBLIC[name]
    cfg = cv.CONVENTIONS[name].to_refbayes(**kw)
    back = _to(name, cfg, kw)
    _equal(back, {k: kw[k] for k in back}, f"{name} public -> cfg -> public")
    _equal(cv.CONVENTIONS[name].to_refbayes(**back), cfg, f"{name} cfg -> public -> cfg")


_unit_open = st.floats(0.01, 0.99)
_pos = st.floats(1e-4, 1e3)


@given(lr=_pos, b=_unit_open, e=_unit_open, damp=st.floats(0.0, 1.0), tau=_pos, var=_pos,
       N=st.integers(1, 10 ** 6), ema=st.booleans())
def test_pytorch_sso_vogn_round_trip_hypothesis(lr, b, e, damp, tau, var, N, ema):
    kw = dict(dataset_size=N, lr=lr, curv_kwargs={"ema_decay": e, "damping": damp},
              kl_weighting=tau, prior_variance=var)
    kw.update(grad_ema_decay=b) if ema else kw.update(momentum=b, momentum_type="raw")
    cfg = cv.from_pytorch_sso_vogn(**kw)
    _equal(cv.from_pytorch_sso_vogn(**cv.to_pytorch_sso_vogn(cfg)), cfg, "cfg round trip")
    if ema:  # the EMA form comes back as the equivalent raw-momentum form
        out = cv.to_pytorch_sso_vogn(cfg)
        assert_close(np.array([out["momentum"], out["lr"]]), np.array([1 - b, lr * b]),
                     EXACT_F64, "reparameterisation")


@given(lr=_pos, b1=st.one_of(st.just(0.0), _unit_open), b2=st.one_of(st.just(0.0), _unit_open),
       lam=_pos,
       N=st.integers(1, 10 ** 6), eps=_pos)
def test_adaptive_round_trips_hypothesis(lr, b1, b2, lam, N, eps):
    for name, kw in [
        ("emtiyaz_vadam", dict(train_set_size=N, lr=lr, betas=(b1, b2), prior_prec=lam)),
        ("emtiyaz_vprop", dict(train_set_size=N, lr=lr, beta=b2, prior_prec=lam)),
        ("emtiyaz_vogn", dict(train_set_size=N, lr=lr, beta=b2, prior_prec=lam)),
        ("slang_bbb", dict(train_set_size=N, prior_prec=lam, lr=lr, betas=(b1, b2), eps=eps)),
        ("torch_sgd", dict(N=N, lr=lr, momentum=b1, weight_decay=lam)),
    ]:
        c = cv.CONVENTIONS[name]
        cfg = c.to_refbayes(**kw)
        back = c.from_refbayes(cfg)
        _equal({k: back[k] for k in kw}, kw, f"{name} public round trip")
        _equal(c.to_refbayes(**back), cfg, f"{name} cfg round trip")


@given(p0=st.floats(0.0, 100.0), N=st.integers(1, 1000), lam=_pos, tau=_pos)
def test_initial_precision_round_trips(p0, N, lam, tau):
    cfg_v = vadam.VadamConfig(N, lam)
    s0 = cv.s0_from_emtiyaz_prec_init(lam + p0, cfg_v)
    assert_close(np.array(cv.emtiyaz_prec_init_from_s0(s0, cfg_v)), np.array(lam + p0),
                 EXACT_F64, "prec_init")
    cfg = vogn.VOGNConfig(N, lam, tau=tau)
    p = cv.pytorch_sso_init_precision_from_s0(p0, cfg)
    back = cv.pytorch_sso_init_precision_from_s0(cv.s0_from_pytorch_sso_init_precision(p, cfg), cfg)
    assert_close(np.array(back), np.array(p), EXACT_F64, "init_precision")


def test_to_functions_emit_the_public_keyword_names():
    names = {
        "pytorch_sso_vogn": set(inspect.signature(cv.from_pytorch_sso_vogn).parameters),
        "emtiyaz_vadam": {"train_set_size", "lr", "betas", "prior_prec"},
        "emtiyaz_vprop": {"train_set_size", "lr", "beta", "prior_prec"},
        "emtiyaz_vogn": {"train_set_size", "lr", "beta", "prior_prec"},
    }
    for name, allowed in names.items():
        assert set(_to(name, cv.CONVENTIONS[name].to_refbayes(**PUBLIC[name]), PUBLIC[name])) \
            <= allowed


# ----------------------------------------------------------------------------- bad input

BAD = [
    (cv.from_emtiyaz_vadam, dict(train_set_size=10, lr=-1.0), "lr"),
    (cv.from_emtiyaz_vadam, dict(train_set_size=10, lr="0.1"), "lr"),
    (cv.from_emtiyaz_vadam, dict(train_set_size=10, betas=(0.9, 1.0)), "betas[1]"),
    (cv.from_emtiyaz_vadam, dict(train_set_size=10, betas=0.9), "betas"),
    (cv.from_emtiyaz_vadam, dict(train_set_size=0), "train_set_size"),
    (cv.from_emtiyaz_vadam, dict(train_set_size=10.5), "train_set_size"),
    (cv.from_emtiyaz_vadam, dict(train_set_size=10, prior_prec=np.ones(3)), "prior_prec"),
    (cv.from_emtiyaz_vprop, dict(train_set_size=10, beta=float("nan")), "beta"),
    (cv.from_emtiyaz_vogn, dict(train_set_size=10, prior_prec=0.0), "prior_prec"),
    (cv.from_emtiyaz_vogn, dict(train_set_size=10, lr=float("inf")), "lr"),
    (cv.from_emtiyaz_vogn, dict(train_set_size=10, num_samples=0), "num_samples"),
    (cv.from_pytorch_sso_vogn, dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1}),
     "curv_kwargs"),
    (cv.from_pytorch_sso_vogn,
     dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1, "damping": -1.0}),
     "curv_kwargs['damping']"),
    (cv.from_pytorch_sso_vogn, dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1, "damping": 0.0},
                                    warmup_kl_weighting_steps=1000), "warmup_kl_weighting_steps"),
    (cv.from_pytorch_sso_vogn, dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1, "damping": 0.0},
                                    momentum=0.9), "momentum_type"),
    (cv.from_pytorch_sso_vogn, dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1, "damping": 0.0},
                                    momentum=0.9, momentum_type="raw", grad_ema_decay=0.1),
     "momentum, grad_ema_decay"),
    (cv.from_pytorch_sso_vogn, dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1, "damping": 0.0},
                                    bias_correction=True), "bias_correction"),
    (cv.from_pytorch_sso_vogn, dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1, "damping": 0.0},
                                    curv_type="Fisher"), "curv_type"),
    (cv.from_pytorch_sso_vogn, dict(dataset_size=10, curv_kwargs={"ema_decay": 0.1, "damping": 0.0},
                                    prior_variance=-2.0), "prior_variance"),
    (cv.from_torch_sgd, dict(N=10, lr=0.1, nesterov=True), "nesterov"),
    (cv.from_torch_sgd, dict(N=10, lr=0.1, dampening=0.1), "dampening"),
    (cv.from_torch_sgd, dict(N=10, lr=0.1, weight_decay=-0.1), "weight_decay"),
    (cv.from_torch_sgd, dict(N=10, lr=0.0), "lr"),
    (cv.from_swa_gaussian, dict(max_num_models=0), "max_num_models"),
    (cv.from_swa_gaussian, dict(max_num_models=5, block=True), "block"),
    (cv.from_swa_gaussian, dict(max_num_models=5, no_cov_mat=True), "no_cov_mat"),
    (cv.from_swa_gaussian, dict(max_num_models=5, scale=float("inf")), "scale"),
    (cv.from_laplace_torch, dict(likelihood="regression", subset_of_weights="all",
                                 hessian_structure="kron"), "hessian_structure"),
    (cv.from_laplace_torch, dict(likelihood="regression", subset_of_weights="all",
                                 hessian_structure="full", temperature=0.5), "temperature"),
    (cv.from_laplace_torch, dict(likelihood="regression", subset_of_weights="all",
                                 hessian_structure="full", prior_mean=1.0), "prior_mean"),
    (cv.from_laplace_torch, dict(likelihood="regression", subset_of_weights="all",
                                 hessian_structure="full", backend="BackPackEF"), "backend"),
    (cv.from_laplace_torch, dict(likelihood="regression", subset_of_weights="all",
                                 hessian_structure="full", backend="Foo"), "backend"),
    (cv.from_slang_bbb, dict(train_set_size=10, prior_prec=1.0, eps=0.0), "eps"),
    (cv.from_slang_bbb, dict(train_set_size=10, prior_prec=np.array([1.0, -1.0])), "prior_prec"),
    (cv.from_slang_bbb, dict(train_set_size=10, prior_prec=1.0, amsgrad=True), "amsgrad"),
]


@pytest.mark.parametrize("fn, kw, arg", BAD, ids=[f"{f.__name__}-{a}" for f, _, a in BAD])
def test_bad_public_input_names_the_argument(fn, kw, arg):
    with pytest.raises(ValueError, match=rf"^{_re(arg)}"):
        fn(**kw)


def _re(s):
    return re.escape(s)


BAD_CFG = [
    (cv.to_pytorch_sso_vogn, vogn.VOGNConfig(10, 1.0, rho=2.0), "cfg.rho"),
    (cv.to_pytorch_sso_vogn, vogn.VOGNConfig(10, 1.0, curvature="ggn"), "cfg.curvature"),
    (cv.to_pytorch_sso_vogn, vogn.VOGNConfig(10, np.ones(3)), "cfg.delta"),
    (cv.to_emtiyaz_vogn, vogn.VOGNConfig(10, 1.0, beta1=0.9), "cfg.beta1"),
    (cv.to_emtiyaz_vogn, vogn.VOGNConfig(10, 1.0, beta1=0.0, tau=0.5), "cfg.tau"),
    (cv.to_emtiyaz_vogn, vadam.VadamConfig(10, 1.0), "cfg"),
    (cv.to_emtiyaz_vadam, vadam.VadamConfig(10, 1.0, bias_correction=False), "cfg.bias_correction"),
    (cv.to_emtiyaz_vadam, vadam.VadamConfig(10, 1.0, squares="per_example"), "cfg.squares"),
    # built by _replace: construction itself refuses alpha < 0 (tests/methods/test_configs.py)
    (cv.to_emtiyaz_vadam, vadam.VadamConfig(10, 1.0)._replace(alpha=-1.0), "cfg.alpha"),
    (cv.to_emtiyaz_vprop, vadam.VadamConfig(10, 1.0), "cfg.beta1"),
    (cv.to_torch_sgd, swag.SGDConfig(10, lam=np.ones(3)), "cfg.lam"),
    (cv.to_swa_gaussian, swag.SGDConfig(10), "cfg"),
    (cv.to_slang_bbb, bbb.BBBConfig(10, 1.0, kl_weight=0.5), "cfg.kl_weight"),
]


@pytest.mark.parametrize("fn, cfg, arg", BAD_CFG, ids=[f"{f.__name__}-{a}" for f, _, a in BAD_CFG])
def test_non_representable_config_is_refused(fn, cfg, arg):
    with pytest.raises(ValueError, match=rf"^{_re(arg)}"):
        fn(cfg)


def test_laplace_kron_and_regression_ef_are_refused():
    with pytest.raises(ValueError, match=r"^cfg\.structure"):
        cv.to_laplace_torch(laplace.LaplaceConfig(structure="kron"), "classification")
    with pytest.raises(ValueError, match=r"^cfg\.curvature"):
        cv.to_laplace_torch(laplace.LaplaceConfig(curvature="ef"), "regression")
    with pytest.raises(ValueError, match=r"^likelihood"):
        cv.to_laplace_torch(laplace.LaplaceConfig(), "poisson")


def test_initial_precision_below_the_prior_is_refused():
    with pytest.raises(ValueError, match=r"^prec_init"):
        cv.s0_from_emtiyaz_prec_init(0.5, vadam.VadamConfig(10, 1.0))
    with pytest.raises(ValueError, match=r"^init_precision"):
        cv.s0_from_pytorch_sso_init_precision(0.0, vogn.VOGNConfig(10, 1.0))
    with pytest.raises(ValueError, match=r"^s0"):
        cv.emtiyaz_prec_init_from_s0(-1.0, vogn.VOGNConfig(10, 1.0))
    with pytest.raises(ValueError, match=r"^cfg\.tau"):
        cv.emtiyaz_prec_init_from_s0(1.0, vogn.VOGNConfig(10, 1.0, tau=0.5))
    with pytest.raises(ValueError, match=r"^cfg"):
        cv.s0_from_emtiyaz_prec_init(1.0, swag.SGDConfig(10))


# ----------------------------------------------------------------------------- docstrings

@pytest.mark.parametrize("name", [n for n in cv.__all__ if callable(getattr(cv, n))
                                  and not n[0].isupper()])
def test_numpydoc(name):
    """The codes tests/test_docstrings.py enforces for refbayes.methods, applied here."""
    import numpydoc.validate

    from tests.test_docstrings import ENFORCED
    res = numpydoc.validate.validate(f"refbayes.conventions.{name}")
    bad = [(c, m) for c, m in res["errors"] if c in ENFORCED]
    assert not bad, bad
