"""Noisy K-FAC / K-FAC (refbayes.methods.noisy_kfac) against dense Kronecker products, a dense
re-implementation of several steps, and the exact Bayesian linear-regression posterior
(derivations/noisy_kfac.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from refbayes.methods import noisy_kfac as nk
from refbayes.methods._estimates import Batch
from refbayes.models import MLP
from tests.tolerances import EXACT_F64, MC_SIGMAS, rel_err


def _spd(rng, n):
    B = rng.standard_normal((n, n))
    return B @ B.T / n + 0.1 * np.eye(n)


def _blr(N=40, p=3, tau=4.0, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, p))
    y = X @ rng.standard_normal(p) + rng.standard_normal(N) / math.sqrt(tau)
    return X, y, MLP([p, 1], "relu", "gaussian", noise_precision=tau)


def test_kfac_with_exact_damping_reaches_the_exact_blr_posterior():
    """(noisy_kfac.2), (noisy_kfac.5): one linear layer with one output, full batch, beta = 1,
    alpha = 1, no momentum, exact damping: A kron S is the exact per-example GGN, so K-FAC is
    Newton's method and its fixed point is the exact posterior N(mu*, (tau X~^T X~ + I / eta)^{-1})
    (mean and the state's covariance), reached at the third step (the first runs with the
    identity factors, the second with the first refresh). The official factored damping adds
    cross terms and misses it (by far more than rounding)."""
    X, y, model = _blr()
    N, tau, eta = X.shape[0], 4.0, 2.0
    Xt = np.hstack([X, np.ones((N, 1))])
    prec = tau * Xt.T @ Xt + np.eye(Xt.shape[1]) / eta
    mu_star = np.linalg.solve(prec, tau * Xt.T @ y)
    for damping, exact in (("exact", True), ("factored", False)):
        cfg = nk.NoisyKFACConfig(N, eta=eta, alpha=1.0, beta=1.0, momentum=0.0, damping=damping)
        state = nk.init(np.zeros(model.D), model)
        for _ in range(3):
            state, _ = nk.step(state, Batch(X, y), None, cfg, model)
        errs = (rel_err(state.mu, mu_star),
                rel_err(nk.dense_covariance(state, cfg, model), np.linalg.inv(prec)))
        if exact:
            assert max(errs) < EXACT_F64
        else:
            assert min(errs) > 1e-4


def _state_with_factors(model, rng):
    state = nk.init(0.3 * rng.standard_normal(model.D), model)
    A = tuple(_spd(rng, F.shape[0]) for F in state.A)
    S = tuple(_spd(rng, F.shape[0]) for F in state.S)
    return state._replace(A=A, S=S, A_ref=A, S_ref=S)


def _dense_block_cov(A, S, c_lam_N, gamma_in, damping):
    if damping == "exact":
        return c_lam_N * np.linalg.inv(np.kron(A, S) + gamma_in * np.eye(A.shape[0] * S.shape[0]))
    pi = math.sqrt((np.trace(A) / A.shape[0]) / (np.trace(S) / S.shape[0]))
    d = math.sqrt(gamma_in)
    return c_lam_N * np.kron(np.linalg.inv(A + pi * d * np.eye(A.shape[0])),
                             np.linalg.inv(S + d / pi * np.eye(S.shape[0])))


@pytest.mark.parametrize("sampler_damping", nk.SAMPLER_DAMPINGS)
@pytest.mark.parametrize("damping", nk.DAMPINGS)
def test_sample_is_the_dense_kronecker_covariance(damping, sampler_damping):
    """(noisy_kfac.6)-(noisy_kfac.7): the sampling map (identity draws) has, per layer, the
    covariance (lambda / N)(A + pi d I)^{-1} kron (S + d / pi I)^{-1} ("factored") or
    (lambda / N)(A kron S + gamma_s I)^{-1} ("exact"), d = sqrt(gamma_s), formed densely with
    np.kron; and no cross-layer covariance. gamma_s is gamma_in ("intrinsic") or
    gamma_in + gamma_ex ("full", torchsso's)."""
    rng = np.random.default_rng(1)
    model = MLP([3, 4, 2], "tanh", "categorical")
    state = _state_with_factors(model, rng)
    cfg = nk.NoisyKFACConfig(25, eta=0.5, kl_weight=0.7, damping=damping, gamma_ex=0.3,
                             sampler_damping=sampler_damping)
    W = nk.sample(state, np.eye(model.D), cfg, model) - state.mu[:, None]
    Sigma = W @ W.T
    g_in = nk.gamma_in(cfg)
    assert g_in == pytest.approx(0.7 / (25 * 0.5), rel=1e-15)
    g_s = g_in if sampler_damping == "intrinsic" else g_in + 0.3
    ref = np.zeros_like(Sigma)
    for (start, stop, _, _), A, S in zip(nk.layer_slices(model), state.A_ref, state.S_ref):
        ref[start:stop, start:stop] = _dense_block_cov(A, S, 0.7 / 25, g_s, damping)
    assert rel_err(Sigma, ref) < EXACT_F64
    assert rel_err(nk.dense_covariance(state, cfg, model), ref) < EXACT_F64


def test_sample_covariance_from_draws():
    """The covariance of 20,000 draws is within MC_SIGMAS standard deviations of the dense one,
    entry by entry (Var(C_hat_ij) = (C_ii C_jj + C_ij^2) / S for Gaussian draws, known mean)."""
    rng = np.random.default_rng(2)
    model = MLP([2, 2], "tanh", "categorical")
    state = _state_with_factors(model, rng)
    cfg = nk.NoisyKFACConfig(10, eta=1.0)
    C = nk.dense_covariance(state, cfg, model)
    S = 20000
    r = nk.sample(state, np.random.default_rng(3).standard_normal((model.D, S)), cfg, model) \
        - state.mu[:, None]
    C_hat = r @ r.T / S
    sd = np.sqrt((np.outer(np.diag(C), np.diag(C)) + C ** 2) / S)
    assert np.all(np.abs(C_hat - C) <= MC_SIGMAS * sd)
    assert not np.all(np.abs(C_hat - 2 * C) <= MC_SIGMAS * sd)


def _sym_root_inv(K):
    """K^{-1/2}, the symmetric root (the exact sampler's map)."""
    lam, Q = np.linalg.eigh(K)
    return Q @ np.diag(lam ** -0.5) @ Q.T


def _dense_statistics(model, X, y, W, y_t, t, A, S, A_ref, S_ref, cfg):
    """Step t's factor EMA (every T_stats) and refresh (every T_inv), from the per-example
    inputs and pre-activation gradients at the draws W (sampled labels y_t for "mc")."""
    M = X.shape[0]
    A, S = list(A), list(S)
    if t % cfg.T_stats == 0:
        for l in range(len(A)):
            Ah = Sh = 0.0
            for s in range(W.shape[1]):
                targets = y_t[s] if cfg.curvature == "mc" else y
                layer = model.kfac_factors(W[:, s], X, targets)[l]
                a = np.hstack([layer.a, np.ones((M, 1))])
                Ah = Ah + a.T @ a / M / W.shape[1]
                Sh = Sh + layer.g.T @ layer.g / M / W.shape[1]
            A[l] = (1 - cfg.beta) * A[l] + cfg.beta * Ah
            S[l] = (1 - cfg.beta) * S[l] + cfg.beta * Sh
    if t % cfg.T_inv == 0:
        A_ref, S_ref = [a.copy() for a in A], [s.copy() for s in S]
    return A, S, A_ref, S_ref


def _dense_steps(model, state, batches, eps_list, cfg, y_tilde_list):
    """A dense re-implementation: explicit Kronecker matrices and solves, the statistics from
    model.kfac_factors (per-example inputs and pre-activation gradients), the draws through the
    Cholesky sampling map written out (factored damping) or the symmetric root of the formed
    (A kron S + gamma_in I)^{-1} (exact damping)."""
    N, lam, eta = cfg.N, cfg.kl_weight, cfg.eta
    g_in = lam / (N * eta)
    gamma = g_in + cfg.gamma_ex
    g_s = g_in if cfg.sampler_damping == "intrinsic" else gamma  # the sampler's damping
    blocks = nk.layer_slices(model)
    mu, m = state.mu.copy(), state.m.copy()
    A, S = [a.copy() for a in state.A], [s.copy() for s in state.S]
    A_ref, S_ref = [a.copy() for a in state.A_ref], [s.copy() for s in state.S_ref]
    for t, ((X, y), eps, y_t) in enumerate(zip(batches, eps_list, y_tilde_list), start=1):
        M = X.shape[0]
        W = np.empty((model.D, eps.shape[1]))
        for (start, stop, n_in, n_out), Af, Sf in zip(blocks, A_ref, S_ref):
            if cfg.damping == "exact":
                T = _sym_root_inv(np.kron(Af, Sf) + g_s * np.eye(n_in * n_out))
            else:
                pi = math.sqrt((np.trace(Af) / n_in) / (np.trace(Sf) / n_out))
                d = math.sqrt(g_s)
                LA = np.linalg.cholesky(Af + pi * d * np.eye(n_in))
                LS = np.linalg.cholesky(Sf + d / pi * np.eye(n_out))
                # vec_row(L_A^{-T} E L_S^{-1}) = (L_A^{-T} kron L_S^{-T}) vec_row(E)
                T = np.kron(np.linalg.inv(LA).T, np.linalg.inv(LS).T)
            W[start:stop] = mu[start:stop, None] + math.sqrt(lam / N) * (T @ eps[start:stop])
        grads = [model.grad(W[:, s], X, y) for s in range(W.shape[1])]
        V = np.mean(grads, axis=0) / M + g_in * W.mean(axis=1)
        if cfg.refresh_order == "before":  # torchsso's: statistics and refresh, then the solve
            A, S, A_ref, S_ref = _dense_statistics(model, X, y, W, y_t, t, A, S, A_ref, S_ref, cfg)
        K = []  # the damped dense preconditioner of each block
        for (start, stop, n_in, n_out), Af, Sf in zip(blocks, A_ref, S_ref):
            if cfg.damping == "exact":
                K.append(np.kron(Af, Sf) + gamma * np.eye(n_in * n_out))
            else:
                pi = math.sqrt((np.trace(Af) / n_in) / (np.trace(Sf) / n_out))
                r = math.sqrt(gamma)
                K.append(np.kron(Af + pi * r * np.eye(n_in), Sf + r / pi * np.eye(n_out)))

        def solve(v):
            return np.concatenate([np.linalg.solve(K_l, v[start:stop])
                                   for (start, stop, _, _), K_l in zip(blocks, K)])
        if cfg.momentum_type == "raw":  # torchsso's: the heavy ball on V, then one solve
            m = cfg.momentum * m + V
            mu = mu - cfg.alpha * (solve(m) + cfg.weight_decay * mu)
        else:
            m = cfg.momentum * m + solve(V) + cfg.weight_decay * mu
            mu = mu - cfg.alpha * m
        if cfg.refresh_order == "after":
            A, S, A_ref, S_ref = _dense_statistics(model, X, y, W, y_t, t, A, S, A_ref, S_ref, cfg)
    return mu, m, A, S


@pytest.mark.parametrize("T_stats, T_inv, curvature, damping, weight_decay, sampler_damping, "
                         "refresh, momentum_type",
                         [(1, 1, "ef", "factored", 0.0, "intrinsic", "after", "preconditioned"),
                          (2, 3, "ef", "factored", 0.0, "intrinsic", "after", "preconditioned"),
                          (1, 2, "mc", "factored", 0.0, "intrinsic", "after", "preconditioned"),
                          (1, 1, "ef", "exact", 0.0, "intrinsic", "after", "preconditioned"),
                          (2, 3, "mc", "exact", 0.0, "intrinsic", "after", "preconditioned"),
                          (1, 1, "ef", "factored", 0.3, "full", "after", "preconditioned"),
                          (2, 3, "mc", "factored", 0.3, "intrinsic", "after", "preconditioned"),
                          (1, 2, "ef", "exact", 0.3, "full", "after", "preconditioned"),
                          (1, 1, "ef", "factored", 0.3, "full", "before", "preconditioned"),
                          (2, 3, "mc", "factored", 0.0, "intrinsic", "before", "preconditioned"),
                          (1, 2, "ef", "exact", 0.3, "full", "before", "preconditioned"),
                          (1, 1, "ef", "factored", 0.3, "full", "before", "raw"),
                          (2, 3, "mc", "factored", 0.0, "intrinsic", "after", "raw"),
                          (1, 2, "ef", "exact", 0.3, "intrinsic", "before", "raw")])
def test_steps_match_a_dense_reimplementation(T_stats, T_inv, curvature, damping, weight_decay,
                                              sampler_damping, refresh, momentum_type):
    """Five consecutive steps on an MLP with two hidden layers, S = 2 draws, minibatches of
    different sizes, gamma_ex > 0: mean, momentum and factors equal the dense
    re-implementation, under both dampings; T_stats, T_inv > 1 included (so the cached
    operators are reused between refreshes); "mc" with the caller's sampled labels; torchsso's
    decoupled weight decay delta, its sampler damped by gamma ("full"), its order (a due
    refresh before the solve) and its 'raw' momentum (the heavy ball before the solve)
    included."""
    # checks (noisy_kfac.3), (noisy_kfac.4), (noisy_kfac.6), (noisy_kfac.8), (noisy_kfac.9),
    # (noisy_kfac.11), (noisy_kfac.12), (noisy_kfac.20)
    rng = np.random.default_rng(4)
    model = MLP([3, 4, 3, 3], "tanh", "categorical")
    N = 30
    Xall, yall = rng.standard_normal((N, 3)), rng.integers(0, 3, N)
    cfg = nk.NoisyKFACConfig(N, eta=0.5, alpha=0.05, beta=0.3, momentum=0.5, gamma_ex=1e-2,
                             T_stats=T_stats, T_inv=T_inv, curvature=curvature, damping=damping,
                             weight_decay=weight_decay, sampler_damping=sampler_damping,
                             refresh_order=refresh, momentum_type=momentum_type)
    state = nk.init(model.init_theta(rng), model)
    sizes = [8, 5, 8, 7, 8]
    batches, eps_list, y_t = [], [], []
    start = 0
    for M in sizes:
        idx = np.arange(start, start + M) % N
        start += M
        batches.append((Xall[idx], yall[idx]))
        eps_list.append(rng.standard_normal((model.D, 2)))
        y_t.append(rng.integers(0, 3, (2, M)))
    s = state
    for (X, y), eps, yt in zip(batches, eps_list, y_t):
        s, info = nk.step(s, Batch(X, y), eps, cfg, model,
                          y_tilde=yt if curvature == "mc" else None)
    mu, m, A, S = _dense_steps(model, state, batches, eps_list, cfg, y_t)
    assert rel_err(s.mu, mu) < EXACT_F64 and rel_err(s.m, m) < EXACT_F64
    for l in range(3):
        assert rel_err(s.A[l], A[l]) < EXACT_F64 and rel_err(s.S[l], S[l]) < EXACT_F64


def test_kl_clipping_bounds_the_update_norm():
    """(noisy_kfac.10): with kl_clip = kappa, the clipped update alpha nu P has squared K-FAC
    norm alpha^2 nu^2 <V, P> = kappa when the unclipped one exceeds it (nu < 1), and nu = 1 (the
    unclipped step) when it does not; the clipped momentum buffer is nu P (momentum from zero)."""
    rng = np.random.default_rng(7)
    model = MLP([3, 4, 2], "tanh", "categorical")
    X, y = rng.standard_normal((10, 3)), rng.integers(0, 2, 10)
    state = nk.init(model.init_theta(rng), model)
    base = nk.NoisyKFACConfig(10, alpha=0.5)
    _, free = nk.step(state, Batch(X, y), None, base, model)
    norm2 = base.alpha ** 2 * float(free.V @ free.P)
    for kappa, clipped in ((norm2 / 9, True), (norm2 * 4, False)):
        new, info = nk.step(state, Batch(X, y), None, base._replace(kl_clip=kappa), model)
        if clipped:
            assert info.nu == pytest.approx(1 / 3, rel=1e-12)
            # the clipped update's squared K-FAC norm alpha^2 nu^2 <V, P_free> is kappa
            assert base.alpha ** 2 * info.nu ** 2 * float(free.V @ free.P) \
                == pytest.approx(kappa, rel=1e-12)
        else:
            assert info.nu == 1.0
        assert rel_err(new.m, info.nu * free.P) < EXACT_F64
    with pytest.raises(ValueError, match="cfg.kl_clip"):
        nk.step(state, Batch(X, y), None, base._replace(kl_clip=0.0), model)


def test_kfac_is_the_step_at_the_mean():
    """eps = None evaluates at mu (K-FAC), the same as zero draws."""
    rng = np.random.default_rng(5)
    model = MLP([2, 3, 2], "tanh", "categorical")
    X, y = rng.standard_normal((6, 2)), rng.integers(0, 2, 6)
    cfg = nk.NoisyKFACConfig(6, alpha=0.1)
    state = nk.init(model.init_theta(rng), model)
    a, ia = nk.step(state, Batch(X, y), None, cfg, model)
    b, _ = nk.step(state, Batch(X, y), np.zeros((model.D, 1)), cfg, model)
    assert ia.w.shape == (model.D, 1)
    assert rel_err(a.mu, b.mu) < EXACT_F64


def test_bad_input_is_rejected_with_the_argument_named():
    rng = np.random.default_rng(6)
    model = MLP([2, 3, 2], "tanh", "categorical")
    X, y = rng.standard_normal((4, 2)), rng.integers(0, 2, 4)
    state = nk.init(np.zeros(model.D), model)
    cfg = nk.NoisyKFACConfig(4)
    cases = [
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(damping="dense"), model),
         "cfg.damping"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(curvature="hessian"), model),
         "cfg.curvature"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(curvature="mc"), model),
         "y_tilde"),
        (lambda: nk.step(state, Batch(X, y), None, cfg, model, y_tilde=np.zeros((1, 4), int)),
         "y_tilde"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(curvature="mc"), model,
                         y_tilde=[[0, 1, 0, 1]]), "y_tilde"),
        (lambda: nk.step(state, Batch(X, y), np.ones((model.D + 1, 1)), cfg, model), "eps"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(T_inv=0), model), "cfg.T_inv"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(beta=0.0), model), "cfg.beta"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(weight_decay=-0.1), model),
         "cfg.weight_decay"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(sampler_damping="gamma"), model),
         "cfg.sampler_damping"),
        (lambda: nk.NoisyKFACConfig(4, weight_decay=float("nan")), "cfg.weight_decay"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(refresh_order="first"), model),
         "cfg.refresh_order"),
        (lambda: nk.step(state._replace(A=state.A[:1]), Batch(X, y), None, cfg, model),
         "state.A"),
        (lambda: nk.init(np.zeros(model.D + 1), model), "model"),
        (lambda: nk.step(state, Batch(X, y), None, cfg._replace(momentum_type="nesterov"), model),
         "cfg.momentum_type"),
        (lambda: nk.NoisyKFACConfig(4, momentum_type="raw", kl_clip=1e-3),
         r"cfg.kl_clip: expected None with momentum_type 'raw'"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=name):
            call()


def _cycle_inputs(seed=8, N=20, steps=6):
    rng = np.random.default_rng(seed)
    model = MLP([3, 5, 2], "tanh", "categorical")
    X, y = rng.standard_normal((N, 3)), rng.integers(0, 2, N)
    state = _state_with_factors(model, rng)
    eps = [rng.standard_normal((model.D, 2)) for _ in range(steps)]
    return model, Batch(X, y), state, eps


@pytest.mark.parametrize("damping", nk.DAMPINGS)
def test_the_cached_operators_are_those_of_a_ref_and_never_stale(damping):
    """(noisy_kfac.12): the operators are computed at a refresh and reused until the next one
    (the same object between refreshes, new ones at each refresh, made from the new A_ref,
    S_ref); a state without them, with other A_ref / S_ref (``_replace``), or stepped with
    another damping gets them recomputed, so every step equals the step of the same state
    with ``inv=None`` exactly."""
    model, batch, state, eps = _cycle_inputs()
    cfg = nk.NoisyKFACConfig(20, eta=0.5, alpha=0.05, beta=0.3, gamma_ex=1e-2, T_inv=3,
                             damping=damping)
    s = nk.refresh(state, cfg, model)
    assert s.inv.A_ref is s.A_ref and s.inv.S_ref is s.S_ref
    assert s.inv.key == (damping, nk.gamma_in(cfg), nk.gamma_in(cfg) + 1e-2)
    for e in eps:
        new, info = nk.step(s, batch, e, cfg, model)
        bare, bare_info = nk.step(s._replace(inv=None), batch, e, cfg, model)
        assert np.array_equal(new.mu, bare.mu) and np.array_equal(info.w, bare_info.w)
        if new.t % cfg.T_inv == 0:
            assert new.A_ref is new.A and new.inv is not s.inv
            assert new.inv.A_ref is new.A_ref and new.inv.S_ref is new.S_ref
        else:
            assert new.inv is s.inv
        s = new
    # stale operators (made for other factors, or for another damping) are not used
    other = nk.refresh(_state_with_factors(model, np.random.default_rng(9)), cfg, model)
    mixed = s._replace(inv=other.inv)
    other_damping = "exact" if damping == "factored" else "factored"
    for c in (cfg, cfg._replace(gamma_ex=0.5), cfg._replace(eta=2.0),
              cfg._replace(damping=other_damping)):
        b, ib = nk.step(s._replace(inv=None), batch, eps[0], c, model)
        for start in (mixed, s):  # other factors; s's own factors but maybe another damping
            a, ia = nk.step(start, batch, eps[0], c, model)
            assert np.array_equal(a.mu, b.mu) and np.array_equal(ia.w, ib.w)
            assert np.array_equal(nk.sample(start, eps[0], c, model), ib.w)
    assert not np.array_equal(nk.step(other._replace(A_ref=s.A_ref, S_ref=s.S_ref), batch,
                                      eps[0], cfg, model)[1].w,
                              nk.step(other, batch, eps[0], cfg, model)[1].w)
    # K-FAC keeps only the solve's operators; a draw from such a state computes the sampler's
    kfac = nk.refresh(s._replace(inv=None), cfg, model, sampler=False)
    assert all((op.L_A_in if damping == "factored" else op.root) is None for op in kfac.inv.layers)
    after, _ = nk.step(kfac, batch, None, cfg._replace(T_inv=1000), model)
    assert after.inv is kfac.inv  # no refresh: the same operators, none added
    a, ia = nk.step(kfac, batch, eps[0], cfg, model)
    b, ib = nk.step(kfac._replace(inv=None), batch, eps[0], cfg, model)
    assert np.array_equal(a.mu, b.mu) and np.array_equal(ia.w, ib.w)
    with pytest.raises(ValueError, match="sampler"):
        nk.refresh(s, cfg, model, sampler=1)
    with pytest.raises(ValueError, match="state.inv"):
        nk.step(s._replace(inv=("not", "operators")), batch, eps[0], cfg, model)


@pytest.mark.parametrize("damping", nk.DAMPINGS)
def test_kfac_needs_its_factors_definite_only_at_its_own_damping(damping):
    """K-FAC (eps = None) never draws, so its refreshed factors need only be definite at its
    damping gamma = gamma_in + gamma_ex: factors from the statistics of 2 rows (rank <= 2, beta
    = 1), gamma_in ~ 5e-41 (eta = 1e40) and gamma_ex = 1e-2 give a step whose preconditioned
    gradient equals the dense solve with the damped Kronecker matrix; a draw from the same
    state needs them definite at gamma_in and is refused, naming positive definiteness."""
    rng = np.random.default_rng(11)
    model = MLP([3, 5, 2], "tanh", "categorical")
    X, y = rng.standard_normal((2, 3)), np.array([0, 1])
    gamma_ex = 1e-2
    cfg = nk.NoisyKFACConfig(2, eta=1e40, alpha=0.1, beta=1.0, momentum=0.0, gamma_ex=gamma_ex,
                             damping=damping)
    state, _ = nk.step(nk.init(model.init_theta(rng), model), Batch(X, y), None, cfg, model)
    new, info = nk.step(state, Batch(X, y), None, cfg, model)
    gamma = nk.gamma_in(cfg) + gamma_ex
    for (start, stop, n_in, n_out), A, S in zip(nk.layer_slices(model), state.A_ref,
                                                state.S_ref):
        assert np.linalg.eigvalsh(A)[0] < 1e-12  # singular: rank <= 2 < n_in + 1
        if damping == "exact":
            K = np.kron(A, S) + gamma * np.eye(n_in * n_out)
        else:
            pi, r = math.sqrt((np.trace(A) / n_in) / (np.trace(S) / n_out)), math.sqrt(gamma)
            K = np.kron(A + pi * r * np.eye(n_in), S + r / pi * np.eye(n_out))
        assert rel_err(info.P[start:stop], np.linalg.solve(K, info.V[start:stop])) < EXACT_F64
    with pytest.raises(ValueError, match="positive definite"):
        nk.sample(state, np.zeros((model.D, 1)), cfg, model)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("damping", nk.DAMPINGS)
def test_steps_in_each_backend_and_dtype_equal_the_float64_steps(damping, dtype, xp):
    """Six steps (T_inv = 3, so two refreshes) run in the backend under test and in float32
    equal the NumPy float64 steps: dtype kept everywhere, mean, draws and factors within the
    stated exact-identity tolerance of the dtype."""
    from refbayes.backend import to_numpy
    from tests.tolerances import exact
    model, batch, state, eps = _cycle_inputs()
    cfg = nk.NoisyKFACConfig(20, eta=0.5, alpha=0.05, beta=0.3, gamma_ex=1e-2, T_inv=3,
                             damping=damping)
    conv = lambda a: xp.asarray(a.astype(dtype))  # noqa: E731
    s64 = state
    s = nk.NoisyKFACState(conv(state.mu), conv(state.m), *(tuple(conv(F) for F in Fs) for Fs in
                          (state.A, state.S, state.A_ref, state.S_ref)), 0)
    xb = Batch(conv(batch.X), xp.asarray(batch.y))
    for e in eps:
        s64, i64 = nk.step(s64, batch, e, cfg, model)
        s, info = nk.step(s, xb, conv(e), cfg, model)
        assert s.mu.dtype == dtype and info.w.dtype == dtype and s.A[1].dtype == dtype
        assert rel_err(to_numpy(info.w), i64.w) < exact(dtype)
        assert rel_err(to_numpy(s.mu), s64.mu) < exact(dtype)
        for F, F64 in zip(s.S + s.A, s64.S + s64.A):
            assert rel_err(to_numpy(F), F64) < exact(dtype)


@pytest.mark.parametrize("damping", nk.DAMPINGS)
def test_sample_draws_are_the_printed_map(damping):
    """Draw by draw, written out here per layer on its row-major (n_in + 1, n_out) block E_s:
    factored W_s = M + sqrt(lambda / N) L_A^{-T} E_s L_S^{-1}, L_A L_A^T = A + pi sqrt(gamma_in)
    I, L_S L_S^T = S + sqrt(gamma_in) / pi I, pi = sqrt((tr A / dim A) / (tr S / dim S)),
    gamma_in = lambda / (N eta) (explicit inverses); exact: vec_row(W_s - M) = sqrt(lambda / N)
    (A kron S + gamma_in I)^{-1/2} vec_row(E_s), the symmetric root by eigh. The covariance
    test above sees only W W^T, blind to a sign flip, to L_A^{-1} for L_A^{-T} paired with the
    matching change in L_S, or to a permutation of the draws within a block; this one is not."""
    # checks (noisy_kfac.2), (noisy_kfac.5), (noisy_kfac.6), (noisy_kfac.7)
    rng = np.random.default_rng(5)
    model = MLP([3, 4, 2], "tanh", "categorical")
    state = _state_with_factors(model, rng)
    N, eta, lam = 25, 0.5, 0.7
    cfg = nk.NoisyKFACConfig(N, eta=eta, kl_weight=lam, gamma_ex=0.3, damping=damping)
    eps = np.hstack([rng.standard_normal((model.D, 3)), np.eye(model.D)])
    g_in = lam / (N * eta)  # (noisy_kfac.2); gamma_ex does not enter the sampler
    by_hand, start = np.empty_like(eps), 0
    for A, S in zip(state.A_ref, state.S_ref):
        n_in, n_out = A.shape[0], S.shape[0]
        stop = start + n_in * n_out
        if damping == "factored":
            pi = math.sqrt((np.trace(A) / n_in) / (np.trace(S) / n_out))  # (noisy_kfac.5)
            L_A = np.linalg.cholesky(A + pi * math.sqrt(g_in) * np.eye(n_in))
            L_S = np.linalg.cholesky(S + math.sqrt(g_in) / pi * np.eye(n_out))
            for s in range(eps.shape[1]):
                E = eps[start:stop, s].reshape(n_in, n_out)
                Z = np.linalg.inv(L_A).T @ E @ np.linalg.inv(L_S)  # (noisy_kfac.7)
                by_hand[start:stop, s] = state.mu[start:stop] + math.sqrt(lam / N) * Z.reshape(-1)
        else:
            w, Q = np.linalg.eigh(np.kron(A, S) + g_in * np.eye(n_in * n_out))  # (noisy_kfac.6)
            root = (Q / np.sqrt(w)) @ Q.T
            by_hand[start:stop] = state.mu[start:stop, None] \
                + math.sqrt(lam / N) * (root @ eps[start:stop])  # (noisy_kfac.7)
        start = stop
    assert start == model.D
    assert rel_err(nk.sample(state, eps, cfg, model), by_hand) < EXACT_F64
    assert np.max(np.abs(by_hand - state.mu[:, None])) > 1e-2  # the perturbation is not negligible


def test_factored_pi_divides_by_the_bias_augmented_dimension():
    """(noisy_kfac.12): pi = sqrt((tr A_ref / (n_in + 1)) / (tr S_ref / n_out)) for a layer with a
    bias, A_ref being (n_in + 1) square (notation.md: n_in counts the inputs, A_l the bias row
    too). One linear layer, n_in = 2, n_out = 3: the sampler's covariance (lambda / N)
    (A + pi d I)^{-1} kron (S + d / pi I)^{-1} and K-FAC's preconditioned gradient
    (A + pi r I)^{-1} V (S + r / pi I)^{-1} of the code equal those with the divisor n_in + 1 = 3
    and differ from those with n_in = 2 (the note's earlier tr A_ref / n_in)."""
    # checks (noisy_kfac.12)
    rng = np.random.default_rng(12)
    model = MLP([2, 3], "tanh", "gaussian")
    n_in, n_out = 2, 3
    state = _state_with_factors(model, rng)
    A, S = state.A_ref[0], state.S_ref[0]
    assert A.shape == (n_in + 1, n_in + 1) and S.shape == (n_out, n_out)
    N, eta, lam, g_ex = 10, 0.05, 0.7, 0.2
    cfg = nk.NoisyKFACConfig(N, eta=eta, kl_weight=lam, gamma_ex=g_ex, alpha=1.0, momentum=0.0,
                             damping="factored")
    g_in = lam / (N * eta)
    X, y = rng.standard_normal((5, n_in)), rng.standard_normal((5, n_out))
    _, info = nk.step(state, Batch(X, y), None, cfg, model)  # K-FAC: w = mu, P the solve of V

    def by_hand(divisor):
        pi = math.sqrt((np.trace(A) / divisor) / (np.trace(S) / n_out))
        d, r = math.sqrt(g_in), math.sqrt(g_in + g_ex)
        cov = lam / N * np.kron(np.linalg.inv(A + pi * d * np.eye(n_in + 1)),
                                np.linalg.inv(S + d / pi * np.eye(n_out)))
        V = info.V.reshape(n_in + 1, n_out)
        P = np.linalg.solve(A + pi * r * np.eye(n_in + 1), V) @ np.linalg.inv(S + r / pi * np.eye(n_out))
        return cov, P.reshape(-1)

    cov, P = by_hand(n_in + 1)
    assert rel_err(nk.dense_covariance(state, cfg, model), cov) < EXACT_F64
    assert rel_err(info.P, P) < EXACT_F64
    cov_n, P_n = by_hand(n_in)
    assert rel_err(nk.dense_covariance(state, cfg, model), cov_n) > 1e-3
    assert rel_err(info.P, P_n) > 1e-3


def test_v_is_the_negated_ascent_form_averaged_over_the_draws():
    """(noisy_kfac.8) with S draws: V = (1 / S) sum_s V_s, V_s = (1/M) sum_i grad l_i(w_s)
    + gamma_in w_s; the official code (and the issue's transcription of Zhang et al.'s Algorithm
    2; the paper itself was not read, derivations/noisy_kfac.md) uses the ascent form V_l^asc =
    D_{W_l} log p - gamma_in W_l (and M_l <- M_l + alpha ...), so V = -(1/S) sum_s V_s^asc and the mean
    moves by +alpha times the preconditioned ascent direction. Written out from model.grad (the
    SUMMED negative log-likelihood) at the step's own draws info.w; the one-draw V_1 is not V."""
    # checks (noisy_kfac.8), (noisy_kfac.11)
    rng = np.random.default_rng(8)
    model = MLP([3, 4, 2], "tanh", "categorical")
    state = _state_with_factors(model, rng)
    N, eta, lam, S = 30, 0.5, 0.7, 3
    cfg = nk.NoisyKFACConfig(N, eta=eta, kl_weight=lam, alpha=0.1, momentum=0.0)
    g_in = lam / (N * eta)
    X, y = rng.standard_normal((6, 3)), rng.integers(0, 2, 6)
    M = X.shape[0]
    eps = rng.standard_normal((model.D, S))
    new, info = nk.step(state, Batch(X, y), eps, cfg, model)
    assert rel_err(info.w, nk.sample(state, eps, cfg, model)) < EXACT_F64
    ascent = [-model.grad(info.w[:, s], X, y) / M - g_in * info.w[:, s] for s in range(S)]
    V = -np.mean(ascent, axis=0)
    assert rel_err(info.V, V) < EXACT_F64
    assert rel_err(info.V, -ascent[0]) > 1e-3  # one draw's V is not the step's
    # momentum 0 from m = 0: M <- M - alpha P, i.e. + alpha times the solve of the ascent form
    assert not np.any(state.m) and rel_err(new.mu, state.mu - cfg.alpha * info.P) < EXACT_F64


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("gamma_ex", [0.0, 0.05])
def test_the_trmm_sampler_of_a_reused_refresh_is_the_triangular_solve(gamma_ex, dtype):
    """T_inv > 1 keeps L_A_in^{-1}, L_S_in^{-1} and draws by two triangular products: the same
    draws as kron.sample_chol's triangular solves, to rounding, for S = 1 and S = 3."""
    from refbayes.linalg import kron
    rng = np.random.default_rng(5)
    model = MLP([3, 5, 2], "tanh", "gaussian")
    A = tuple(_spd(rng, n_in).astype(dtype) for _, _, n_in, _ in nk.layer_slices(model))
    S = tuple(_spd(rng, n_out).astype(dtype) for _, _, _, n_out in nk.layer_slices(model))
    state = nk.NoisyKFACState(rng.standard_normal(model.D).astype(dtype),
                              np.zeros(model.D, dtype), A, S, A, S, 0)
    cfg = nk.NoisyKFACConfig(N=10, gamma_ex=gamma_ex, T_inv=4)
    state = nk.refresh(state, cfg, model)
    assert all(op.R_A_in is not None for op in state.inv.layers)
    tol = EXACT_F64 if dtype == np.float64 else 1e-5
    for n_draws in (1, 3):
        eps = rng.standard_normal((model.D, n_draws)).astype(dtype)
        got = nk.sample(state, eps, cfg, model)
        assert got.dtype == dtype
        for (start, stop, n_in, n_out), op in zip(nk.layer_slices(model), state.inv.layers):
            Z = kron.sample_chol(op.L_A_in, op.L_S_in, eps[start:stop].reshape(n_in, n_out,
                                                                                 n_draws))
            want = state.mu[start:stop, None] + math.sqrt(1 / 10) * Z.reshape(-1, n_draws)
            assert rel_err(got[start:stop], want) < tol


def test_step_tau_is_the_former_name_of_noise_precisions_kept_one_release_with_a_warning():
    """Issue 38, item 3: step(tau=) (per-draw noise precisions, not a tempering) is renamed
    noise_precisions=; the old keyword gives the same step and a DeprecationWarning."""
    model = MLP([2, 3, 1], activation="tanh", likelihood="gaussian", noise_precision=1.0)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((6, 2)), rng.standard_normal(6)
    cfg = nk.NoisyKFACConfig(6, eta=1.0, kl_weight=1.0, alpha=0.1, curvature="ef")
    state = nk.init(model.init_theta(rng), model)
    eps = rng.standard_normal((model.D, 2))
    taus = np.array([2.0, 0.5])
    want, _ = nk.step(state, (X, y), eps, cfg, model, noise_precisions=taus)
    with pytest.warns(DeprecationWarning, match=r"noisy_kfac.step\(tau=\) is renamed"):
        got, _ = nk.step(state, (X, y), eps, cfg, model, tau=taus)
    assert np.array_equal(got.mu, want.mu) and np.array_equal(got.m, want.m)
    with pytest.raises(ValueError, match="noise_precisions= only"):
        nk.step(state, (X, y), eps, cfg, model, noise_precisions=taus, tau=taus)


@pytest.mark.parametrize("damping", nk.DAMPINGS)
def test_the_mean_step_preconditions_with_the_factors_of_the_last_refresh(damping):
    """C4 (derivations/noisy_kfac.md), the update order: step t's P is the damped solve
    (noisy_kfac.9) of V with the A_ref, S_ref the step STARTS with, and only afterwards are
    step t's statistics averaged in (noisy_kfac.4) and the factors refreshed (noisy_kfac.12),
    as in the official code. The other order (refresh with step t's statistics before the
    solve, which the issue's transcription attributes to Algorithm 2) gives another P: it is
    torchsso's, ``refresh_order="before"``, whose P is the solve with the refreshed factors (the
    draws and V the same). One layer, T_stats = T_inv = 1, beta = 0.5, curvature "ef", one
    draw, float64."""
    # checks (noisy_kfac.9), (noisy_kfac.12)
    rng = np.random.default_rng(38)
    model = MLP([2, 3], "tanh", "gaussian")
    state = _state_with_factors(model, rng)
    N, eta, lam, g_ex = 20, 0.5, 0.8, 0.1
    cfg = nk.NoisyKFACConfig(N, eta=eta, kl_weight=lam, gamma_ex=g_ex, alpha=0.1, beta=0.5,
                             momentum=0.0, curvature="ef", damping=damping)
    gamma = lam / (N * eta) + g_ex
    X, y = rng.standard_normal((7, 2)), rng.standard_normal((7, 3))
    new, info = nk.step(state, Batch(X, y), rng.standard_normal((model.D, 1)), cfg, model)

    def solve(A, S):
        if damping == "exact":
            K = np.kron(A, S) + gamma * np.eye(A.shape[0] * S.shape[0])
        else:
            pi = math.sqrt((np.trace(A) / A.shape[0]) / (np.trace(S) / S.shape[0]))
            r = math.sqrt(gamma)
            K = np.kron(A + pi * r * np.eye(A.shape[0]), S + r / pi * np.eye(S.shape[0]))
        return np.linalg.solve(K, info.V)

    A_new = 0.5 * state.A[0] + 0.5 * info.A_hat[0]
    S_new = 0.5 * state.S[0] + 0.5 * info.S_hat[0]
    assert rel_err(new.A_ref[0], A_new) < EXACT_F64 and rel_err(new.S_ref[0], S_new) < EXACT_F64
    assert rel_err(info.P, solve(state.A_ref[0], state.S_ref[0])) < EXACT_F64
    assert rel_err(info.P, solve(A_new, S_new)) > 1e-3
    assert rel_err(new.mu, state.mu - cfg.alpha * info.P) < EXACT_F64
    # refresh_order="before" (torchsso's): the same draws and V, then the solve with A_new, S_new
    eps = rng.standard_normal((model.D, 1))
    a, ia = nk.step(state, Batch(X, y), eps, cfg, model)
    b, ib = nk.step(state, Batch(X, y), eps, cfg._replace(refresh_order="before"), model)
    assert rel_err(ib.w, ia.w) < EXACT_F64 and rel_err(ib.V, ia.V) < EXACT_F64
    A_new = 0.5 * state.A[0] + 0.5 * ib.A_hat[0]
    S_new = 0.5 * state.S[0] + 0.5 * ib.S_hat[0]
    info = ib  # solve() reads info.V
    assert rel_err(ib.P, solve(A_new, S_new)) < EXACT_F64
    assert rel_err(ib.P, ia.P) > 1e-3
    assert rel_err(b.A_ref[0], a.A_ref[0]) < EXACT_F64 and b.inv.A_ref is b.A_ref


def test_raw_momentum_preconditions_the_buffer_and_equals_the_default_without_momentum():
    """(noisy_kfac.20): with momentum 0 the two momentum types take the same step (the solve is
    linear: K^{-1} V + delta mu both ways); with momentum > 0 the 'raw' buffer is the heavy
    ball of V, P is the solve of it (at the factors the step used), and the mean moves by
    alpha (P + delta mu), not by alpha times the preconditioned buffer."""
    rng = np.random.default_rng(11)
    model = MLP([3, 4, 2], "tanh", "categorical")
    X, y = rng.standard_normal((12, 3)), rng.integers(0, 2, 12)
    state = _state_with_factors(model, rng)._replace(m=0.1 * rng.standard_normal(model.D))
    eps = rng.standard_normal((model.D, 2))
    cfg = nk.NoisyKFACConfig(12, eta=0.5, alpha=0.05, beta=0.3, gamma_ex=1e-2, weight_decay=0.2,
                             sampler_damping="full")  # the sampler's covariance: (lam / N) K^{-1}
    flat = cfg._replace(momentum=0.0)
    a, ia = nk.step(state, Batch(X, y), eps, flat, model)
    b, ib = nk.step(state, Batch(X, y), eps, flat._replace(momentum_type="raw"), model)
    assert rel_err(b.mu, a.mu) < EXACT_F64 and rel_err(ib.P, ia.P) < EXACT_F64
    raw = cfg._replace(momentum_type="raw")
    new, info = nk.step(state, Batch(X, y), eps, raw, model)
    assert rel_err(info.m, raw.momentum * state.m + info.V) < EXACT_F64
    # the solve at the step's factors (refresh_order "after": the last refresh's, state's A_ref,
    # S_ref) is K^{-1} = (N / lam) Sigma, Sigma the "full" sampler's covariance (noisy_kfac.6)
    K_inv = (raw.N / raw.kl_weight) * nk.dense_covariance(state, raw, model)
    assert rel_err(info.P, K_inv @ info.m + raw.weight_decay * state.mu) < EXACT_F64
    assert rel_err(new.mu, state.mu - raw.alpha * info.P) < EXACT_F64
    assert rel_err(new.mu, nk.step(state, Batch(X, y), eps, cfg, model)[0].mu) > 1e-3
