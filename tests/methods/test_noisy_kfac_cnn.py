"""Noisy K-FAC and K-FAC (refbayes.methods.noisy_kfac) on a CNN: the block map against
``kfac_layout``, the draws and a few steps against a dense re-implementation that permutes theta
into the K-FAC order with an explicit D x D permutation matrix built from ``kfac_layout``
(conv.24), forms the Kronecker blocks with np.kron and takes the statistics from
``kfac_factors`` ("expand", (conv.26), (conv.29)); and a short reproducible training loop.
derivations/conv.md (conv.33)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from refbayes.methods import noisy_kfac as nk
from refbayes.methods._estimates import Batch, kfac_blocks
from refbayes.models.conv import CNN, Activation, Conv2d, Dense, Flatten, tiny_cnn
from tests.tolerances import EXACT_F64, rel_err


def _strided_cnn():
    """Padding 1, stride 2 on a 7x7 input (-> 2x4x4), tanh, then a dense head."""
    return CNN((1, 7, 7), [Conv2d(1, 2, 3, stride=2, padding=1), Activation("tanh"), Flatten(),
                           Dense(32, 3)], "categorical")


MODELS = {"tiny": tiny_cnn, "strided": _strided_cnn}


def _perm_matrix(model):
    """Pm (D, D) with Pm theta = the layers' vec_row_major(W~_l) concatenated (conv.24)."""
    perm = np.concatenate([idx.ravel() for idx in model.kfac_layout()])
    assert np.array_equal(np.sort(perm), np.arange(model.D))
    return np.eye(model.D)[perm]


def _dims(model):
    return [idx.shape for idx in model.kfac_layout()]


def _spd(rng, n):
    B = rng.standard_normal((n, n))
    return B @ B.T / n + 0.5 * np.eye(n)


@pytest.mark.parametrize("name", MODELS)
def test_the_block_map_is_the_layout(name):
    """(conv.33): every block's slice tiles theta in order, and to_kfac / from_kfac gather
    W~ = theta[idx] (kfac_layout) and scatter it back; dense layers keep perm None."""
    model = MODELS[name]()
    theta = np.random.default_rng(0).standard_normal(model.D)
    blocks = kfac_blocks(model)
    assert [(b.start, b.stop, b.n_a, b.n_b) for b in blocks] == nk.layer_slices(model)
    assert blocks[0].start == 0 and blocks[-1].stop == model.D
    for b, idx in zip(blocks, model.kfac_layout()):
        W = theta[b.start:b.stop] if b.perm is None else theta[b.start:b.stop][b.perm]
        assert np.array_equal(W.reshape(b.n_a, b.n_b), theta[idx])
        if b.perm is not None:
            assert np.array_equal(W[b.inv], theta[b.start:b.stop])
    assert blocks[0].perm is not None and blocks[-1].perm is None  # conv, then dense


def _state_with_factors(model, rng):
    state = nk.init(0.3 * rng.standard_normal(model.D), model)
    A = tuple(_spd(rng, F.shape[0]) for F in state.A)
    S = tuple(_spd(rng, F.shape[0]) for F in state.S)
    return state._replace(A=A, S=S, A_ref=A, S_ref=S)


def _sampler_blocks(A_ref, S_ref, g_in, damping):
    """Per layer the dense map T_l with vec_row(Z) = T_l vec_row(E) (noisy_kfac.6)."""
    out = []
    for A, S in zip(A_ref, S_ref):
        n_a, n_b = A.shape[0], S.shape[0]
        if damping == "exact":
            w, Q = np.linalg.eigh(np.kron(A, S) + g_in * np.eye(n_a * n_b))
            out.append((Q / np.sqrt(w)) @ Q.T)
        else:
            pi = math.sqrt((np.trace(A) / n_a) / (np.trace(S) / n_b))
            d = math.sqrt(g_in)
            LA = np.linalg.cholesky(A + pi * d * np.eye(n_a))
            LS = np.linalg.cholesky(S + d / pi * np.eye(n_b))
            out.append(np.kron(np.linalg.inv(LA).T, np.linalg.inv(LS).T))
    return out


def _blockdiag(blocks):
    n = sum(b.shape[0] for b in blocks)
    out, k = np.zeros((n, n)), 0
    for b in blocks:
        out[k:k + b.shape[0], k:k + b.shape[0]] = b
        k += b.shape[0]
    return out


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("damping", nk.DAMPINGS)
def test_sample_draws_are_the_printed_map(name, damping):
    """(noisy_kfac.6)-(noisy_kfac.7) through the block map (conv.33): w = mu + sqrt(lambda / N)
    Pm^T blockdiag_l(T_l) Pm eps, with Pm from kfac_layout; and dense_covariance its square."""
    model = MODELS[name]()
    rng = np.random.default_rng(5)
    state = _state_with_factors(model, rng)
    N, eta, lam = 25, 0.5, 0.7
    cfg = nk.NoisyKFACConfig(N, eta=eta, kl_weight=lam, gamma_ex=0.3, damping=damping)
    eps = rng.standard_normal((model.D, 3))
    Pm = _perm_matrix(model)
    T = Pm.T @ _blockdiag(_sampler_blocks(state.A_ref, state.S_ref, lam / (N * eta), damping)) @ Pm
    by_hand = state.mu[:, None] + math.sqrt(lam / N) * (T @ eps)
    assert rel_err(nk.sample(state, eps, cfg, model), by_hand) < EXACT_F64
    assert rel_err(nk.dense_covariance(state, cfg, model), lam / N * T @ T.T) < EXACT_F64
    assert np.max(np.abs(by_hand - state.mu[:, None])) > 1e-2


def _dense_steps(model, state, batches, eps_list, cfg, y_tilde_list):
    """The steps written out in the K-FAC order: draws mu + Pm^T T Pm eps, the solve
    Pm^T K^{-1} Pm V with K = blockdiag of the damped Kronecker products, and the statistics
    A = sum_i U~_i U~_i^T / (M P), S = sum_i Delta_i Delta_i^T / M from kfac_factors (expand;
    P = 1 for a dense layer)."""
    N, lam, eta = cfg.N, cfg.kl_weight, cfg.eta
    g_in = lam / (N * eta)
    gamma = g_in + cfg.gamma_ex
    Pm = _perm_matrix(model)
    L = len(state.A)
    mu, m = state.mu.copy(), state.m.copy()
    A, S = [a.copy() for a in state.A], [s.copy() for s in state.S]
    A_ref, S_ref = [a.copy() for a in state.A_ref], [s.copy() for s in state.S_ref]
    for t, ((X, y), eps, y_t) in enumerate(zip(batches, eps_list, y_tilde_list), start=1):
        M = X.shape[0]
        if eps is None:
            W = mu[:, None]
        else:
            T = Pm.T @ _blockdiag(_sampler_blocks(A_ref, S_ref, g_in, cfg.damping)) @ Pm
            W = mu[:, None] + math.sqrt(lam / N) * (T @ eps)
        grads = [model.grad(W[:, s], X, y) for s in range(W.shape[1])]
        V = np.mean(grads, axis=0) / M + g_in * W.mean(axis=1)
        Ks = []
        for Af, Sf in zip(A_ref, S_ref):
            n_a, n_b = Af.shape[0], Sf.shape[0]
            if cfg.damping == "exact":
                Ks.append(np.kron(Af, Sf) + gamma * np.eye(n_a * n_b))
            else:
                pi = math.sqrt((np.trace(Af) / n_a) / (np.trace(Sf) / n_b))
                r = math.sqrt(gamma)
                Ks.append(np.kron(Af + pi * r * np.eye(n_a), Sf + r / pi * np.eye(n_b)))
        P = Pm.T @ np.linalg.solve(_blockdiag(Ks), Pm @ V)
        m = cfg.momentum * m + P
        mu = mu - cfg.alpha * m
        if t % cfg.T_stats == 0:
            for l in range(L):
                Ah = Sh = 0.0
                for s in range(W.shape[1]):
                    targets = y_t[s] if cfg.curvature == "mc" else y
                    layer = model.kfac_factors(W[:, s], X, targets)[l]
                    a, g = layer.a, layer.g
                    if a.ndim == 2:  # dense: one position
                        a, g = a[:, :, None], g[:, :, None]
                    Pn = a.shape[2]
                    U = np.concatenate([a, np.ones((M, 1, Pn))], axis=1)
                    Ah = Ah + np.einsum("iqp,irp->qr", U, U) / (M * Pn) / W.shape[1]
                    Sh = Sh + np.einsum("iop,irp->or", g, g) / M / W.shape[1]
                A[l] = (1 - cfg.beta) * A[l] + cfg.beta * Ah
                S[l] = (1 - cfg.beta) * S[l] + cfg.beta * Sh
        if t % cfg.T_inv == 0:
            A_ref, S_ref = [a.copy() for a in A], [s.copy() for s in S]
    return mu, m, A, S


@pytest.mark.parametrize("name, T_stats, T_inv, curvature, damping, S",
                         [("tiny", 1, 1, "ef", "factored", 2),
                          ("tiny", 1, 2, "mc", "exact", 2),
                          ("strided", 1, 1, "ef", "exact", 2),
                          ("strided", 2, 1, "mc", "factored", 1),
                          ("tiny", 1, 1, "ef", "factored", 0),     # K-FAC (eps None)
                          ("strided", 1, 1, "ef", "exact", 0)])    # K-FAC
def test_steps_match_a_dense_reimplementation(name, T_stats, T_inv, curvature, damping, S):
    """Three steps on a CNN (minibatches of different sizes, gamma_ex > 0, momentum): mean,
    momentum and factors equal the dense steps through the layout's permutation matrix;
    Noisy K-FAC with S draws, K-FAC (S = 0: eps None, evaluated at mu)."""
    # checks (noisy_kfac.3), (noisy_kfac.4), (noisy_kfac.8), (noisy_kfac.9), (noisy_kfac.11),
    # (conv.33)
    rng = np.random.default_rng(4)
    model = MODELS[name]()
    N = 12
    Xall, yall = rng.standard_normal((N, model.n_in)), rng.integers(0, 3, N)
    cfg = nk.NoisyKFACConfig(N, eta=0.5, alpha=0.05, beta=0.3, momentum=0.5, gamma_ex=1e-2,
                             T_stats=T_stats, T_inv=T_inv, curvature=curvature, damping=damping)
    state = nk.init(model.init_theta(rng), model)
    batches, eps_list, y_t, start = [], [], [], 0
    for M in (5, 3, 4):
        idx = np.arange(start, start + M) % N
        start += M
        batches.append((Xall[idx], yall[idx]))
        eps_list.append(rng.standard_normal((model.D, S)) if S else None)
        y_t.append(rng.integers(0, 3, (max(S, 1), M)))
    s = state
    for (X, y), eps, yt in zip(batches, eps_list, y_t):
        s, _ = nk.step(s, Batch(X, y), eps, cfg, model,
                       y_tilde=yt if curvature == "mc" else None)
    mu, m, A, Sf = _dense_steps(model, state, batches, eps_list, cfg, y_t)
    assert rel_err(s.mu, mu) < EXACT_F64 and rel_err(s.m, m) < EXACT_F64
    for l in range(len(A)):
        assert rel_err(s.A[l], A[l]) < EXACT_F64 and rel_err(s.S[l], Sf[l]) < EXACT_F64
    assert rel_err(s.mu, state.mu) > 1e-3  # the steps moved the mean


def _train(model, X, y, cfg, seed, S, steps=3, M=4):
    rng = np.random.default_rng(seed)
    state = nk.init(model.init_theta(rng), model)
    for _ in range(steps):
        idx = rng.choice(len(X), size=M, replace=False)
        eps = rng.standard_normal((model.D, S)) if S else None
        state, _ = nk.step(state, Batch(X[idx], y[idx]), eps, cfg, model)
    return state


@pytest.mark.parametrize("S", [0, 2])
def test_three_step_run_is_finite_and_reproducible(S):
    """A 3-step loop (shuffled minibatches and draws from one seeded generator; refbayes'
    driver.run does not dispatch noisy_kfac): finite, bit-for-bit repeatable, moving."""
    model = tiny_cnn()
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((12, model.n_in)), rng.integers(0, 3, 12)
    cfg = nk.NoisyKFACConfig(12, alpha=0.1, beta=0.5, T_inv=2)
    runs = [_train(model, X, y, cfg, 7, S) for _ in range(2)]
    assert runs[0].t == 3
    for a, b in zip(runs[0][:6], runs[1][:6]):
        if isinstance(a, tuple):
            assert all(np.array_equal(u, v) for u, v in zip(a, b))
        else:
            assert np.array_equal(a, b)
    assert np.isfinite(runs[0].mu).all() and np.isfinite(runs[0].m).all()
    assert all(np.isfinite(F).all() for F in runs[0].A + runs[0].S)
    assert not np.array_equal(runs[0].mu, _train(model, X, y, cfg, 7, S, steps=0).mu)
