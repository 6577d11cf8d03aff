"""refbayes.methods.noise_gamma and the per-draw precisions of the weight steps
(derivations/noise_gamma.md), against integrals, autograd, TensorFlow's Adam written out and one
model per draw."""
from __future__ import annotations

import math

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from autograd.scipy.special import digamma as a_digamma
from autograd.scipy.special import gammaln as a_gammaln
from scipy import integrate, stats

from refbayes.methods import noise_gamma, noisy_adam, noisy_kfac
from refbayes.methods.vadam import grad_moments
from refbayes.models import MLP
from tests.tolerances import EXACT_F64, QUADRATURE, assert_close

CFG = noise_gamma.NoiseGammaConfig(N=50, a0=6.0, b0=6.0, kl_weight=1.0)


def _q_pdf(a, b):
    return stats.gamma(a, scale=1.0 / b).pdf


@pytest.mark.parametrize("a,b,a0,b0", [(6.0, 6.0, 6.0, 6.0), (30.0, 2.0, 6.0, 6.0),
                                       (2.5, 0.4, 3.0, 1.5)])
def test_kl_gamma_is_the_integral(a, b, a0, b0):
    """(noise_gamma.5) against int q log(q / p) by quadrature."""
    q, p = stats.gamma(a, scale=1.0 / b), stats.gamma(a0, scale=1.0 / b0)
    lo, hi = q.ppf(1e-14), q.ppf(1.0 - 1e-14)
    value, _ = integrate.quad(lambda t: q.pdf(t) * (q.logpdf(t) - p.logpdf(t)), lo, hi,
                              epsabs=0.0, epsrel=1e-12, limit=200)
    assert_close(noise_gamma.kl_gamma(a, b, a0, b0), value, QUADRATURE, "Gamma KL")


def test_objective_is_the_expected_negative_log_likelihood():
    """(noise_gamma.4): J - KL / N = E_q[-log N(y | f, 1 / tau)] - log(2 pi) / 2 per row at a
    residual r2, by quadrature over tau."""
    # checks (noise_gamma.1): E_q[tau], E_q[log tau]
    a, b, r2 = 9.0, 3.0, 2.0
    q = stats.gamma(a, scale=1.0 / b)
    lo, hi = q.ppf(1e-14), q.ppf(1.0 - 1e-14)
    # -log N(y | f, 1 / tau) with (y - f)^2 = r2, without the constant (1/2) log(2 pi)
    value, _ = integrate.quad(lambda t: q.pdf(t) * (0.5 * t * r2 - 0.5 * math.log(t)), lo, hi,
                              epsabs=0.0, epsrel=1e-12, limit=200)
    kl = noise_gamma.kl_gamma(a, b, CFG.a0, CFG.b0) / CFG.N
    assert_close(noise_gamma.objective(np.log([a, b]), r2, CFG) - kl, value, QUADRATURE,
                 "expected negative log-likelihood")


def _J_autograd(phi, r2, cfg):
    a, b = anp.exp(phi[0]), anp.exp(phi[1])
    kl = ((a - cfg.a0) * a_digamma(a) - a_gammaln(a) + a_gammaln(cfg.a0)
          + cfg.a0 * (anp.log(b) - anp.log(cfg.b0)) + a * (cfg.b0 - b) / b)
    return 0.5 * (r2 * a / b - (a_digamma(a) - anp.log(b))) + cfg.kl_weight * kl / cfg.N


@pytest.mark.parametrize("phi,r2", [((math.log(6.0), math.log(6.0)), 1.3),
                                    ((3.0, -1.0), 0.05), ((5.0, 1.0), 0.4)])
def test_objective_grad_is_the_autograd_gradient(phi, r2):
    """(noise_gamma.6) against autograd of (noise_gamma.4) written plainly (KL included)."""
    phi = np.array(phi)
    assert_close(noise_gamma.objective(phi, r2, CFG), _J_autograd(phi, r2, CFG), EXACT_F64, "J")
    assert_close(noise_gamma.objective_grad(phi, r2, CFG),
                 autograd.grad(_J_autograd)(phi, r2, CFG), EXACT_F64, "dJ / dphi")


@pytest.mark.parametrize("kl_weight,r2", [(1.0, 0.02), (1.0, 1.3), (0.5, 0.2)])
def test_optimum_is_the_conjugate_posterior(kl_weight, r2):
    """(noise_gamma.7): dJ / dphi = 0 at Gamma(a0 + N / (2 w), b0 + N r2 / (2 w)), w the KL
    weight, and J is larger a step away in either coordinate."""
    cfg = CFG._replace(kl_weight=kl_weight)
    a = cfg.a0 + cfg.N / (2 * kl_weight)
    b = cfg.b0 + cfg.N * r2 / (2 * kl_weight)
    phi = np.log([a, b])
    grad = noise_gamma.objective_grad(phi, r2, cfg)
    assert np.max(np.abs(grad)) <= 10 * EXACT_F64 * a  # O(a) terms cancelling
    J = noise_gamma.objective(phi, r2, cfg)
    for d in ([0.05, 0], [-0.05, 0], [0, 0.05], [0, -0.05]):
        assert noise_gamma.objective(phi + np.array(d), r2, cfg) > J


def test_step_is_tensorflows_adam():
    """(noise_gamma.8): TensorFlow's AdamOptimizer, written in its own form:
    lr_t = lr sqrt(1 - b2^k) / (1 - b1^k), phi -= lr_t m / (sqrt(v) + eps)."""
    state = noise_gamma.init()
    phi, m, v = state.phi.copy(), np.zeros(2), np.zeros(2)
    cfg = CFG._replace(lr=0.05)
    for k, r2 in enumerate([0.8, 0.5, 0.61, 0.2, 0.33], start=1):
        g = noise_gamma.objective_grad(phi, r2, cfg)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        lr_t = cfg.lr * math.sqrt(1 - 0.999 ** k) / (1 - 0.9 ** k)
        phi = phi - lr_t * m / (np.sqrt(v) + cfg.eps_tf)
        state, info = noise_gamma.step(state, r2, cfg)
        assert_close(state.phi, phi, EXACT_F64, f"phi after update {k}")
        assert_close(info.grad, g, EXACT_F64, "grad in the info")
    assert state.adam.t == 5


def test_draw_is_numpys_gamma_in_shape_and_rate():
    # checks (noise_gamma.1)
    state = noise_gamma.init(9.0, 3.0)
    got = noise_gamma.draw(state, np.random.default_rng(4), 5)
    want = np.random.default_rng(4).gamma(9.0, 1.0 / 3.0, size=5)
    assert_close(got, want, EXACT_F64, "draws")
    assert noise_gamma.mean(state) == pytest.approx(3.0, rel=EXACT_F64)



def test_residual_r2_is_the_mean_over_draws_and_rows():
    """(noise_gamma.3): r2 = (1 / (S M)) sum_s sum_i (y_i - f(x_i; w_s))^2, the residual the
    UCI driver hands to noise_gamma.step, against the double sum written out (S = 3, M = 5)."""
    from refbayes.experiments.uci_methods import residual_r2

    rng = np.random.default_rng(7)
    F, y = rng.standard_normal((3, 5)), rng.standard_normal(5)
    want = sum((y[i] - F[s, i]) ** 2 for s in range(3) for i in range(5)) / (3 * 5)
    assert_close(residual_r2(F, y), want, EXACT_F64, "r2")

def test_bad_input_is_refused():
    state = noise_gamma.init()
    with pytest.raises(ValueError, match="r2"):
        noise_gamma.step(state, -0.1, CFG)
    with pytest.raises(ValueError, match="cfg.N"):
        noise_gamma.step(state, 0.1, CFG._replace(N=0))
    with pytest.raises(ValueError, match="cfg.beta2"):
        noise_gamma.step(state, 0.1, CFG._replace(beta2=1.0))
    with pytest.raises(ValueError, match="NoiseGammaConfig"):
        noise_gamma.step(state, 0.1, {"N": 5})
    with pytest.raises(ValueError, match="phi"):
        noise_gamma.objective(np.array([1.0, np.nan]), 0.1, CFG)
    with pytest.raises(ValueError, match="a: expected"):
        noise_gamma.init(0.0, 1.0)
    with pytest.raises(ValueError, match="rng"):
        noise_gamma.draw(state, 3, 2)


# ----------------------------------------------------------------------------- per-draw precisions

def _net(tau=1.0):
    return MLP([3, 4, 1], "tanh", "gaussian", noise_precision=tau)


def _data(S=3, M=6, seed=0):
    rng = np.random.default_rng(seed)
    model = _net()
    return (rng.standard_normal((S, model.D)), rng.standard_normal((M, 3)),
            rng.standard_normal(M), rng.uniform(0.3, 4.0, S), rng.standard_normal((S, M)))


@pytest.mark.parametrize("curvature", [None, "ef", "mc", "ggn"])
def test_kfac_moments_scale_is_a_per_draw_noise_precision(curvature):
    """(noise_gamma.2): kfac_moments with scale tau at unit precision equals one call per draw
    with noise_precision tau_s ("mc": "ef" at the draw's own labels), averaged as (peg.14)."""
    thetas, X, y, tau, y_curv = _data()
    S = thetas.shape[0]
    curv = "ef" if curvature == "mc" else curvature
    labels = y_curv if curvature == "mc" else None
    g, factors = _net().kfac_moments(thetas, X, y, curv, labels, scale=tau)
    acc = None  # per layer (sum_s A_s, sum_s B_s)
    for s in range(S):
        g_s, f_s = _net(tau[s]).kfac_moments(thetas[s:s + 1], X, y, curv,
                                             None if labels is None else labels[s:s + 1])
        assert_close(g[s], g_s[0], EXACT_F64, f"gradient of draw {s}")
        if curv is not None:
            acc = f_s if acc is None else [(A + A_s, B + B_s)
                                           for (A, B), (A_s, B_s) in zip(acc, f_s)]
    if curv is None:
        assert factors is None
        return
    for (A, B), (A_ref, B_ref) in zip(factors, acc):
        assert_close(A, A_ref / S, EXACT_F64, "A_l")
        assert_close(B, B_ref / S, EXACT_F64, "B_l")


@pytest.mark.parametrize("squares", ["per_example", "minibatch"])
def test_grad_moments_scale_is_a_per_draw_noise_precision(squares):
    thetas, X, y, tau, _ = _data()
    g, g_hat, h_hat = grad_moments(_net(), thetas.T.copy(), X, y, squares, tau)
    rows = [grad_moments(_net(tau[s]), thetas[s:s + 1].T.copy(), X, y, squares)
            for s in range(thetas.shape[0])]
    assert_close(g, np.concatenate([r[0] for r in rows]), EXACT_F64, "g")
    assert_close(g_hat, np.mean([r[1] for r in rows], axis=0), EXACT_F64, "g_hat")
    assert_close(h_hat, np.mean([r[2] for r in rows], axis=0), EXACT_F64, "h_hat")


def test_noisy_adam_step_with_tau_is_the_step_of_that_precision():
    rng = np.random.default_rng(2)
    model = _net()
    X, y = rng.standard_normal((6, 3)), rng.standard_normal(6)
    cfg = noisy_adam.NoisyAdamConfig(30, 1.0, alpha=0.01)
    state = noisy_adam.init(model.init_theta(rng), 1.0)
    eps = rng.standard_normal((model.D, 1))
    got, _ = noisy_adam.step(state, (X, y), eps, cfg, model, noise_precisions=np.array([2.7]))
    want, _ = noisy_adam.step(state, (X, y), eps, cfg, _net(2.7))
    for name in ("mu", "m", "f"):
        assert_close(getattr(got, name), getattr(want, name), EXACT_F64, name)


@pytest.mark.parametrize("curvature", ["mc", "ggn"])
def test_noisy_kfac_step_with_tau_is_the_step_of_that_precision(curvature):
    rng = np.random.default_rng(3)
    model = _net()
    X, y = rng.standard_normal((6, 3)), rng.standard_normal(6)
    cfg = noisy_kfac.NoisyKFACConfig(30, eta=1.0, kl_weight=1.0, alpha=0.01, beta=0.1,
                                     curvature=curvature)
    state = noisy_kfac.init(model.init_theta(rng), model)
    eps = rng.standard_normal((model.D, 1))
    y_tilde = rng.standard_normal((1, 6)) if curvature == "mc" else None
    got, _ = noisy_kfac.step(state, (X, y), eps, cfg, model, y_tilde=y_tilde,
                             noise_precisions=np.array([2.7]))
    want, _ = noisy_kfac.step(state, (X, y), eps, cfg, _net(2.7), y_tilde=y_tilde)
    for name in ("mu", "m", "A", "S"):
        assert_close(_flat(getattr(got, name)), _flat(getattr(want, name)), EXACT_F64, name)


def _flat(value):
    """An array, or a tuple of per-layer arrays concatenated."""
    return np.concatenate([a.ravel() for a in value]) if isinstance(value, tuple) else value


def test_per_draw_precisions_are_checked():
    rng = np.random.default_rng(4)
    X, y = rng.standard_normal((6, 3)), rng.standard_normal(6)
    cfg = noisy_adam.NoisyAdamConfig(30, 1.0)
    state = noisy_adam.init(_net().init_theta(rng), 1.0)
    eps = rng.standard_normal((_net().D, 2))
    with pytest.raises(ValueError, match="noise_precision 1"):
        noisy_adam.step(state, (X, y), eps, cfg, _net(2.0), noise_precisions=np.ones(2))
    with pytest.raises(ValueError, match=r"tau: expected a \(2,\) array"):
        noisy_adam.step(state, (X, y), eps, cfg, _net(), noise_precisions=np.ones(3))
    with pytest.raises(ValueError, match="tau: expected > 0"):
        noisy_adam.step(state, (X, y), eps, cfg, _net(), noise_precisions=np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="scale: expected a"):
        _net().kfac_moments(rng.standard_normal((2, _net().D)), X, y, "ef",
                            scale=np.ones(3))
