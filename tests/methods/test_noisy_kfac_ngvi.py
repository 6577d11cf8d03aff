"""Noisy K-FAC (refbayes.methods.noisy_kfac) as the full-Gaussian natural-gradient VI step of
refbayes.methods.ngvi, with the precision one step ahead (issue 12; derivations/noisy_kfac.md,
(noisy_kfac.13)-(noisy_kfac.19)).

The map. One linear layer MLP([p, k]) with a Gaussian likelihood of noise precision tau, the
same batches with one common input factor A_hat = X~_B^T X~_B / M (the full batch, or rows
with one Gram matrix), Noisy K-FAC with damping="exact", gamma_ex = 0, momentum 0, no KL
clipping, T_stats = T_inv = 1, an output statistic S_hat = tau I (curvature "ggn"; "mc" with
labels whose residuals have the exact second moment I / tau), draws of zero sample mean (eps =
None, or antithetic columns); ngvi.step_full with decay = 0, momentum 0, alpha and beta those of
Noisy K-FAC, lam = 1 / eta, the likelihood tempered to tau / kl_weight, curvature "exact" (k = 1)
or "hess" with draws of zero sample mean. With Pi(A, S) = (N / kl_weight) A kron S + I / eta the
precision of Noisy K-FAC's q (noisy_kfac.13), start ngvi at Sigma_inv_0 = Pi(A_0, S_0) and Noisy
K-FAC at the factors one statistics update later, A_1 = (1 - beta) A_0 + beta A_hat,
S_1 = (1 - beta) S_0 + beta tau I, both at mu_0. Then after every step t

    mu_t (Noisy K-FAC) = mu_t (ngvi),   Pi(A_{t+1}, S_{t+1}) = Sigma_inv_{t+1} (ngvi),

provided (A_0 - A_hat) kron (S_0 - tau I) = 0 (S_0 = tau I, or A_0 = A_hat; anything when
beta = 1).

Why exact: the gradient of a linear-Gaussian model is affine in w, so with draws of zero sample
mean both methods' gradients are the gradient at mu, and Noisy K-FAC's prior term at the draws,
gamma_in mean_s w_s, is gamma_in mu (noisy_kfac.16); A kron S with S = tau I is the exact Hessian
of the batch, and the EMA of the two factors is the EMA of their product up to the cross term
beta (1 - beta) (A - A_hat) kron (S - S_hat) (noisy_kfac.15); Noisy K-FAC preconditions its mean
step with the factors refreshed at the step before, ngvi with the precision it has just updated:
with a constant A_hat the two agree when ngvi's precision runs one EMA update behind the factors
(noisy_kfac.17). Both sides are the package's own functions; the only arithmetic in the tests is
the starting states of the map and the constructed draws and labels. Equal to EXACT_F64
(relative) over 4 steps; the errors measured are about 2e-15.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from refbayes.methods import ngvi
from refbayes.methods import noisy_kfac as nk
from refbayes.methods._estimates import Batch
from refbayes.models import MLP
from tests.tolerances import EXACT_F64, rel_err

N, P, TAU, ETA, STEPS = 30, 3, 2.5, 0.8, 4


def _spd(rng, n):
    B = rng.standard_normal((n, n))
    return B @ B.T / n + 0.5 * np.eye(n)


def _data(k, likelihood, rng):
    X = rng.standard_normal((N, P))
    if likelihood == "categorical":
        return X, rng.integers(0, k, N)
    if likelihood == "bernoulli":
        return X, rng.integers(0, 2, N).astype(float)
    Y = X @ rng.standard_normal((P, k)) + rng.standard_normal((N, k)) / math.sqrt(TAU)
    return X, (Y[:, 0] if k == 1 else Y)


def _common_gram_batches(X, y, M, rng):
    """STEPS minibatches of M rows Q_t [X_B, 1] with Q_t orthogonal and Q_t 1 = 1: other rows and
    other targets, one Gram matrix X~_B^T X~_B (the intercept column included)."""
    U = np.linalg.qr(np.hstack([np.ones((M, 1)), rng.standard_normal((M, M - 1))]))[0][:, 1:]
    out = []
    for _ in range(STEPS):
        H = np.linalg.qr(rng.standard_normal((M - 1, M - 1)))[0]
        Q = U @ H @ U.T + np.ones((M, M)) / M
        out.append(Batch(Q @ X[:M], y[rng.permutation(N)[:M]]))
    return out


def _antithetic(rng, D, S):
    """S columns of zero sample mean: (e, -e) for S = 2, (e1, e2, -e1 - e2) for S = 3."""
    E = rng.standard_normal((D, S - 1))
    return np.hstack([E, -E.sum(axis=1, keepdims=True)])


def _mc_labels(state, batch, eps, cfg, model, rng):
    """Labels y~ = f(X_B; w_s) + z with the residuals z whitened over the M rows and S draws:
    (1 / (M S)) sum z z^T = I / tau exactly, so that S_hat = tau^2 (1 / (M S)) sum z z^T = tau I."""
    W = state.mu[:, None] if eps is None else nk.sample(state, eps, cfg, model)
    S, (M, k) = W.shape[1], (batch.X.shape[0], model.sizes[-1])
    Z = rng.standard_normal((S * M, k))
    evals, evecs = np.linalg.eigh(Z.T @ Z / (S * M))
    Z = (Z @ evecs / np.sqrt(evals) @ evecs.T / math.sqrt(TAU)).reshape(S, M, k)
    F = np.stack([model.forward(W[:, s], batch.X) for s in range(S)])
    return (F + Z)[..., 0] if k == 1 else F + Z


BASE = dict(k=2, likelihood="gaussian", kl_weight=1.0, alpha=0.7, beta=0.3, damping="exact",
            gamma_ex=0.0, momentum=0.0, curvature="ggn", start="tau", nk_draws=2, ng="hess",
            batches="full", shift=True)


def _run(**changes):
    """Both methods STEPS steps under the map; the largest relative error of the means and of the
    covariances (Noisy K-FAC's after t steps against ngvi's after t + 1)."""
    c = {**BASE, **changes}
    rng = np.random.default_rng(7)
    k, lam_kl = c["k"], c["kl_weight"]
    X, y = _data(k, c["likelihood"], rng)
    model = MLP([P, k], "relu", c["likelihood"], noise_precision=TAU)
    # ngvi's likelihood, tempered by the KL weight: (N / kl_weight) tau = N (tau / kl_weight)
    model_ng = MLP([P, k], "relu", c["likelihood"], noise_precision=TAU / lam_kl)
    D = model.D
    cfg = nk.NoisyKFACConfig(N, eta=ETA, kl_weight=lam_kl, alpha=c["alpha"], beta=c["beta"],
                             momentum=c["momentum"], gamma_ex=c["gamma_ex"],
                             damping=c["damping"], curvature=c["curvature"])
    cfg_ng = ngvi.NGVIConfig(N, np.full(D, 1 / ETA), alpha=c["alpha"], beta=c["beta"], decay=0.0,
                             curvature="exact" if c["ng"] == "exact" else "hess",
                             momentum=c["momentum"])
    if c["batches"] == "full":
        batches = [Batch(X, y)] * STEPS
    elif c["batches"] == "common-gram":
        batches = _common_gram_batches(X, y, 10, rng)
    elif c["batches"] == "one-example":
        batches = [Batch(X[:1], y[:1])] * STEPS
    else:  # distinct minibatches: the Gram matrix changes from step to step
        batches = [Batch(X[i], y[i]) for i in (rng.permutation(N)[:10] for _ in range(STEPS))]
    mu0 = 0.3 * rng.standard_normal(D)
    # the first batch's statistics at mu_0: A_hat, and S_hat = tau I for the Gaussian
    (A_hat, B_hat), = model.kfac_curvature(mu0, batches[0].X, batches[0].y)
    S_hat = B_hat / batches[0].X.shape[0]
    A0 = A_hat if c["start"] == "A_hat" else _spd(rng, P + 1)
    S0 = TAU * np.eye(k) if c["start"] == "tau" else _spd(rng, k)
    # the map's starting states: ngvi at Pi(A_0, S_0) (noisy_kfac.13), Noisy K-FAC one
    # statistics update later (noisy_kfac.17)
    Pi0 = (N / lam_kl) * np.kron(A0, S0) + np.eye(D) / ETA
    ng_state = ngvi.init_full(mu0, (Pi0 + Pi0.T) / 2)
    b = c["beta"]
    A1, S1 = ((1 - b) * A0 + b * A_hat, (1 - b) * S0 + b * S_hat) if c["shift"] else (A0, S0)
    state = nk.init(mu0, model)._replace(A=(A1,), S=(S1,), A_ref=(A1,), S_ref=(S1,))
    errs = []
    for batch in batches:
        n = c["nk_draws"]
        eps = None if n is None else (
            rng.standard_normal((D, 1)) if n == 1 else _antithetic(rng, D, n))
        y_tilde = _mc_labels(state, batch, eps, cfg, model, rng) if c["curvature"] == "mc" else None
        cov_nk = nk.dense_covariance(state, cfg, model)   # Pi(A_t, S_t)^{-1}, before the step
        state, _ = nk.step(state, batch, eps, cfg, model, y_tilde=y_tilde)
        ng_state, _ = ngvi.step_full(ng_state, batch,
                                     None if c["ng"] == "exact" else _antithetic(rng, D, 2),
                                     cfg_ng, model_ng)
        errs += [rel_err(state.mu, ng_state.mu), rel_err(cov_nk, ngvi.dense_covariance(ng_state))]
    return max(errs)


CASES = {
    # K-FAC (no draws) against ngvi's closed-form expectations, one output, non-identity A_0
    "kfac-exact-1-output": dict(k=1, nk_draws=None, ng="exact", beta=0.3),
    # antithetic draws; kl_weight 0.5 is ngvi on the likelihood tempered to tau / 0.5
    "antithetic-tempered-1-output": dict(k=1, kl_weight=0.5, beta=0.6, ng="exact"),
    "antithetic-2-outputs": dict(),
    # beta = 1: any starting factors (the cross term carries beta (1 - beta))
    "beta-1-any-start": dict(start="any", beta=1.0, nk_draws=3),
    # A_0 = A_hat: the output factor may start anywhere (SPD, not tau I)
    "A0-is-A_hat-3-outputs": dict(k=3, start="A_hat", kl_weight=0.7, beta=0.4, nk_draws=3),
    # Monte Carlo Fisher with labels whose residual second moment is exactly I / tau
    "mc-whitened-labels": dict(curvature="mc", beta=0.5),
    # minibatches of other rows and targets with one Gram matrix
    "common-gram-minibatches": dict(batches="common-gram", nk_draws=None),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_noisy_kfac_is_ngvi_with_the_precision_one_step_ahead(case):
    """(noisy_kfac.13)-(noisy_kfac.18): under the map of the module docstring, 4 steps of
    nk.step and ngvi.step_full give the same means after every step, and Noisy K-FAC's
    covariance after t steps is ngvi's after t + 1, to EXACT_F64 (relative)."""
    # checks (noisy_kfac.1): F maps to ngvi's ELBO, kl_weight 0.5 included
    assert _run(**CASES[case]) < EXACT_F64


BREAKS = {
    # the official factored damping: (A + pi d I) kron (S + d / pi I) is not A kron S + gamma I
    "factored-damping": dict(damping="factored"),
    # extrinsic damping enters the mean's preconditioner, not the precision
    "gamma_ex": dict(gamma_ex=0.05),
    # Noisy K-FAC's heavy ball on P against ngvi's bias-corrected average of g_hat
    "momentum": dict(momentum=0.5),
    # A_0 != A_hat and S_0 != tau I with 0 < beta < 1: the cross term of (noisy_kfac.15)
    "cross-term": dict(start="any"),
    # both started at Pi(A_0, S_0): the preconditioners are one EMA update apart
    "no-shift": dict(shift=False),
    # one draw: the gradient and the prior term at the draw, not at the mean
    "single-draw": dict(nk_draws=1),
    # distinct minibatches: the lag of the preconditioner holds the previous batch's Gram matrix
    "distinct-minibatches": dict(batches="distinct", nk_draws=None),
    # two classes: per-example output factors S_i differ, A kron S is not the Hessian
    "categorical": dict(likelihood="categorical", start="any", nk_draws=None),
    # one example, one output: A kron S is the exact GGN, but the logistic curvature depends on
    # where it is taken: ngvi's is E_q at step t, Noisy K-FAC's a value at mu from the step before
    "bernoulli-one-example": dict(likelihood="bernoulli", k=1, batches="one-example",
                                  start="A_hat", nk_draws=None, ng="exact"),
}


@pytest.mark.parametrize("case", list(BREAKS), ids=list(BREAKS))
def test_outside_the_reduction_the_steps_differ(case):
    """The map is not vacuous: breaking one condition of the passing case "antithetic-2-outputs"
    (with what that change forces: another likelihood has no tau I start) makes the two
    trajectories differ by more than 1e-6 (relative; measured: 3e-2 to 0.3)."""
    assert _run(**BREAKS[case]) > 1e-6


def test_one_draw_differs_by_the_prior_at_the_draw():
    """(noisy_kfac.19): with one draw w (no antithetic partner), feed ngvi ("hess") the draw
    eps' = L^T (w - mu), L L^T its precision, so that its theta is Noisy K-FAC's w; then the
    means after the step differ by exactly alpha Pi_t^{-1} (w - mu_t) / eta: Noisy K-FAC's prior
    term at the draw against ngvi's at the mean, the only difference. Checked along 4 steps of a
    single-draw Noisy K-FAC trajectory, ngvi restarted on the map at every step."""
    rng = np.random.default_rng(3)
    eta = 0.05  # a strong prior: the difference is a sizable part of the step (cancellation)
    X, y = _data(2, "gaussian", rng)
    model = MLP([P, 2], "relu", "gaussian", noise_precision=TAU)
    D, alpha, b = model.D, 0.7, 0.3
    cfg = nk.NoisyKFACConfig(N, eta=eta, alpha=alpha, beta=b, momentum=0.0, damping="exact")
    cfg_ng = ngvi.NGVIConfig(N, np.full(D, 1 / eta), alpha=alpha, beta=b, decay=0.0,
                             curvature="hess")
    mu0 = 0.3 * rng.standard_normal(D)
    A_prev, S_prev = _spd(rng, P + 1), TAU * np.eye(2)
    A_hat = model.kfac_curvature(mu0, X, y)[0][0]
    A1, S1 = (1 - b) * A_prev + b * A_hat, (1 - b) * S_prev + b * TAU * np.eye(2)
    state = nk.init(mu0, model)._replace(A=(A1,), S=(S1,), A_ref=(A1,), S_ref=(S1,))
    for _ in range(STEPS):
        Pi_prev = N * np.kron(A_prev, S_prev) + np.eye(D) / eta               # (noisy_kfac.13)
        ng_state = ngvi.init_full(state.mu, (Pi_prev + Pi_prev.T) / 2)
        eps = rng.standard_normal((D, 1))
        w = nk.sample(state, eps, cfg, model)
        eps_ng = np.linalg.cholesky(ng_state.Sigma_inv).T @ (w - state.mu[:, None])
        cov_nk = nk.dense_covariance(state, cfg, model)
        A_prev, S_prev = state.A[0], state.S[0]
        new, _ = nk.step(state, Batch(X, y), eps, cfg, model)
        ng_new, info = ngvi.step_full(ng_state, Batch(X, y), eps_ng, cfg_ng, model)
        assert rel_err(info.theta, w) < EXACT_F64
        assert rel_err(ngvi.dense_covariance(ng_new), cov_nk) < EXACT_F64
        step_nk, step_ng = new.mu - state.mu, ng_new.mu - state.mu
        predicted = -alpha * cov_nk @ (w[:, 0] - state.mu) / eta
        assert rel_err(step_nk - step_ng, predicted) < EXACT_F64
        assert rel_err(step_nk, step_ng) > 1e-6
        state = new


def test_opposite_single_draw_runs_average_to_ngvi():
    """(noisy_kfac.19): the precision does not depend on the draws and the mean step is affine in
    (mu_t, mean_s w_s - mu_t), so two single-draw Noisy K-FAC runs with the draws eps_t and
    -eps_t average, after every step, to ngvi's closed-form ("exact") trajectory: E_eps[mu_t]
    of Noisy K-FAC is ngvi's mu_t."""
    rng = np.random.default_rng(5)
    X, y = _data(1, "gaussian", rng)
    model = MLP([P, 1], "relu", "gaussian", noise_precision=TAU)
    D, alpha, b = model.D, 0.6, 0.4
    cfg = nk.NoisyKFACConfig(N, eta=ETA, alpha=alpha, beta=b, momentum=0.0, damping="exact")
    cfg_ng = ngvi.NGVIConfig(N, np.full(D, 1 / ETA), alpha=alpha, beta=b, decay=0.0,
                             curvature="exact")
    mu0 = 0.3 * rng.standard_normal(D)
    A0 = _spd(rng, P + 1)
    A1 = (1 - b) * A0 + b * model.kfac_curvature(mu0, X, y)[0][0]
    S1 = np.full((1, 1), TAU)
    Pi0 = N * TAU * A0 + np.eye(D) / ETA                                      # (noisy_kfac.13)
    ng_state = ngvi.init_full(mu0, (Pi0 + Pi0.T) / 2)
    plus = minus = nk.init(mu0, model)._replace(A=(A1,), S=(S1,), A_ref=(A1,), S_ref=(S1,))
    for _ in range(STEPS):
        eps = rng.standard_normal((D, 1))
        plus, _ = nk.step(plus, Batch(X, y), eps, cfg, model)
        minus, _ = nk.step(minus, Batch(X, y), -eps, cfg, model)
        ng_state, _ = ngvi.step_full(ng_state, Batch(X, y), None, cfg_ng, model)
        assert rel_err((plus.mu + minus.mu) / 2, ng_state.mu) < EXACT_F64
        assert rel_err(plus.mu, ng_state.mu) > 1e-6
