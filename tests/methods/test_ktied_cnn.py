"""The k-tied Normal (refbayes.methods.ktied) on CNNs (issue 34): a conv kernel tied as its im2col
matrix A_l (Q, C_out) (ktied.16), and its gradient (ktied.17), on tiny_cnn and a two-conv CNN.

Oracles written here from derivations/ktied.md without the library's code: sigma walked entry by
entry over the kernel indices (o, c, u, v); the Monte Carlo objective through the plain-loop network
of tests/reference/conv_loops.py, differentiated by autograd (no chain rule by hand); Adam by hand
(tests/reference/bbb_dense.adam_hand)."""
import math
import warnings

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

from refbayes.methods import ktied
from refbayes.models import MLP
from refbayes.models.conv import (
    CNN,
    Activation,
    Conv2d,
    Dense,
    Flatten,
    MaxPool2d,
    tiny_cnn,
)
from tests.reference import bbb_dense
from tests.reference.conv_loops import LoopSpec, naive_output
from tests.reference.per_example import naive_nll
from tests.tolerances import EXACT_F64, assert_close

N, M = 10, 3


def _two_conv():
    """(2, 5, 5) -> conv 3x3 (3, pad 1) -> tanh -> conv 2x2 (2, stride 2, no bias) -> relu ->
    maxpool 1 -> flatten (8) -> dense 3; D = 57 + 24 + 27 = 108."""
    layers = [Conv2d(2, 3, 3, padding=1), Activation("tanh"), Conv2d(3, 2, 2, stride=2, bias=False),
              Activation("relu"), MaxPool2d(1), Flatten(), Dense(8, 3)]
    return CNN((2, 5, 5), layers, "categorical")


_MODELS = {"tiny": tiny_cnn, "two-conv": _two_conv}
_K = {"tiny": (2, 1), "two-conv": (2, 1, 2)}


def _problem(model, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, model.n_in)), rng.integers(0, model.n_out, N)


def _start(model, k, seed=1, sigma0=0.3, jitter=0.4):
    rng = np.random.default_rng(seed)
    P = ktied.layout(model, k).P
    return ktied.init(0.5 * rng.standard_normal(model.D), model, k, sigma0,
                      rng.standard_normal(P), jitter)


def _sp(x):
    return anp.log1p(anp.exp(x))


def _factors(rho, spec, k):
    """[(U_l, V_l, softplus(r^b_l) or None)] from rho, walked front to back in the documented
    order: vec R^U_l (m_l k_l, row-major), vec R^V_l (n_l k_l), r^b_l (n_l); (m, n) = (Q, C_out)
    for a Conv2d, (n_in, n_out) for a Dense."""
    out, pos, l = [], 0, 0
    for kind, f in spec.layers:
        if kind == "Conv2d":
            m, n = f["c_in"] * f["kernel"][0] * f["kernel"][1], f["c_out"]
        elif kind == "Dense":
            m, n = f["n_in"], f["n_out"]
        else:
            continue
        c = k[l]
        U = anp.reshape(_sp(rho[pos:pos + m * c]), (m, c))
        V = anp.reshape(_sp(rho[pos + m * c:pos + (m + n) * c]), (n, c))
        pos += (m + n) * c
        sb = None
        if f["bias"]:
            sb = _sp(rho[pos:pos + n])
            pos += n
        out.append((U, V, sb))
        l += 1
    assert pos == len(rho)
    return out


def _sigma_loops(factors, spec):
    """sigma (D,) in theta's order, one entry at a time: kernel entry (o, c, u, v) of a Conv2d
    (row-major, (conv.2)) gets sum_j U[q, j] V[o, j] with q = (c k_h + u) k_w + v; dense entry
    (i, j) gets sum_a U[i, a] V[j, a]; then the bias scales."""
    out, it = [], iter(factors)
    for kind, f in spec.layers:
        if kind == "Conv2d":
            U, V, sb = next(it)
            c_in, (kh, kw) = f["c_in"], f["kernel"]
            for o in range(f["c_out"]):
                for ci in range(c_in):
                    for u in range(kh):
                        for v in range(kw):
                            q = (ci * kh + u) * kw + v
                            out.append(anp.sum(U[q] * V[o]))
        elif kind == "Dense":
            U, V, sb = next(it)
            for i in range(f["n_in"]):
                for j in range(f["n_out"]):
                    out.append(anp.sum(U[i] * V[j]))
        else:
            continue
        if sb is not None:
            out.extend(sb[j] for j in range(sb.shape[0]))
    return anp.stack(out)


def _objective_sigma(mu, sigma, spec, eps, X4, y, lam, kl_weight):
    """(N / (M S)) sum_s sum_i l_i(mu + sigma eps_s) + kl_weight KL through the loop network."""
    data = 0.0
    for s in range(eps.shape[1]):
        theta = mu + sigma * eps[:, s]
        for i in range(len(X4)):
            data = data + naive_nll(spec, naive_output(spec, theta, X4[i]), y[i])
    return (N / (len(X4) * eps.shape[1])) * data + kl_weight * bbb_dense._kl_autograd(mu, sigma, lam)


def _objective_rho(mu, rho, spec, k, eps, X4, y, lam, kl_weight):
    return _objective_sigma(mu, _sigma_loops(_factors(rho, spec, k), spec), spec, eps, X4, y,
                            lam, kl_weight)


def _objective_factors(uv, biases, mu, spec, eps, X4, y, lam, kl_weight):
    """The objective in the factors [(U_l, V_l)] (the bias scales held as given)."""
    factors = [(U, V, sb) for (U, V), sb in zip(uv, biases)]
    return _objective_sigma(mu, _sigma_loops(factors, spec), spec, eps, X4, y, lam, kl_weight)


@pytest.mark.parametrize("kind", ["tiny", "two-conv"])
def test_the_draw_is_mu_plus_sigma_eps_index_by_index(kind):
    # checks (ktied.16): sigma of kernel entry (o, c, u, v) at offset ((o C_in + c) k_h + u) k_w + v
    model, k = _MODELS[kind](), _K[kind]
    spec, state = LoopSpec(model), _start(model, k)
    eps = np.random.default_rng(2).standard_normal((model.D, 2))
    sigma = _sigma_loops(_factors(state.rho, spec, k), spec)
    assert_close(ktied.std(state, model), sigma, EXACT_F64, "sigma")
    draws = ktied.sample(state, eps, model)
    assert draws.shape == (model.D, 2)
    for j in range(model.D):
        for s in range(2):
            assert abs(draws[j, s] - (state.mu[j] + sigma[j] * eps[j, s])) <= EXACT_F64 * (
                1.0 + abs(draws[j, s])), f"theta[{j}, {s}]"
    # scale_parameters gives the factors of the documented rho layout, conv ones (Q, k), (C_out, k)
    for (U, V, sb), (U0, V0, sb0) in zip(ktied.scale_parameters(state, model),
                                         _factors(state.rho, spec, k)):
        assert U.shape == U0.shape and V.shape == V0.shape
        assert_close(U, U0, EXACT_F64, "U")
        assert_close(V, V0, EXACT_F64, "V")
        assert (sb is None) == (sb0 is None)


@pytest.mark.parametrize("kl_weight", [1.0, 0.0])
@pytest.mark.parametrize("kind", ["tiny", "two-conv"])
def test_gradients_are_autograd_of_the_loop_objective(kind, kl_weight):
    # checks (ktied.17): dF/dU = G V, dF/dV = G^T U with G the conv block read transposed,
    # against autograd of the objective written densely through the loop network
    model, k = _MODELS[kind](), _K[kind]
    spec, state = LoopSpec(model), _start(model, k)
    X, y = _problem(model)
    lam = np.linspace(0.2, 3.0, model.D)
    cfg = ktied.KTiedConfig(N, lam, alpha=0.01, kl_weight=kl_weight)
    rng = np.random.default_rng(3)
    idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
    _, info = ktied.step(state, ktied.Batch(X[idx], y[idx]), eps, cfg, model)
    X4 = X[idx].reshape((M,) + model.input_shape)
    g_mu, g_rho = autograd.grad(_objective_rho, (0, 1))(state.mu, state.rho, spec, k, eps, X4,
                                                         y[idx], lam, kl_weight)
    assert_close(info.grad_mu, g_mu, EXACT_F64, "dF/dmu")
    assert_close(info.grad_rho, g_rho, EXACT_F64, "dF/drho")
    # dF/dU, dF/dV themselves: autograd in the factors, against the step's dF/dR / sigmoid(R)
    factors = _factors(state.rho, spec, k)
    g_fac = autograd.grad(_objective_factors)([(U, V) for U, V, _ in factors],
                                              [sb for *_, sb in factors], state.mu, spec, eps,
                                              X4, y[idx], lam, kl_weight)
    lay = ktied.layout(model, k)
    sig = 1.0 / (1.0 + np.exp(-state.rho))
    for l, ((m, n), c) in enumerate(zip(lay.shapes, lay.k)):
        u0, v0 = lay.u_off[l], lay.v_off[l]
        dU = (info.grad_rho[u0:u0 + m * c] / sig[u0:u0 + m * c]).reshape(m, c)
        dV = (info.grad_rho[v0:v0 + n * c] / sig[v0:v0 + n * c]).reshape(n, c)
        assert_close(dU, g_fac[l][0], EXACT_F64, f"dF/dU_{l}")
        assert_close(dV, g_fac[l][1], EXACT_F64, f"dF/dV_{l}")


@pytest.mark.parametrize("kind", ["tiny", "two-conv"])
def test_chained_steps_match_adam_on_the_autograd_gradient(kind):
    # checks (ktied.16), (ktied.17) over three steps of (ktied.7)
    model, k = _MODELS[kind](), _K[kind]
    spec, state = LoopSpec(model), _start(model, k)
    X, y = _problem(model)
    lam = np.linspace(0.2, 3.0, model.D)
    cfg = ktied.KTiedConfig(N, lam, alpha=0.05, beta1=0.8, beta2=0.99, eps_adam=1e-6,
                            kl_weight=0.9)
    mu, rho = state.mu.copy(), state.rho.copy()
    m = v = np.zeros(model.D + len(rho))
    rng = np.random.default_rng(4)
    for t in range(3):
        idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
        state, _ = ktied.step(state, ktied.Batch(X[idx], y[idx]), eps, cfg, model)
        X4 = X[idx].reshape((M,) + model.input_shape)
        g_mu, g_rho = autograd.grad(_objective_rho, (0, 1))(mu, rho, spec, k, eps, X4, y[idx],
                                                             lam, 0.9)
        delta, m, v = bbb_dense.adam_hand(np.concatenate([g_mu, g_rho]), m, v, t, 0.05, 0.8,
                                          0.99, 1e-6)
        mu, rho = mu + delta[:model.D], rho + delta[model.D:]
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")
        assert_close(state.rho, rho, EXACT_F64, f"rho, step {t}")
    assert state.t == 3 and state.k == k


def test_a_1x1_conv_on_a_1x1_image_is_the_dense_tie():
    # checks (ktied.16), (ktied.17): a 1 x 1 conv on a 1 x 1 image is the dense layer W = Wm^T;
    # with the same rho, sigma and the whole step are the MLP's, theta permuted Wm <-> W
    cnn = CNN((3, 1, 1), [Conv2d(3, 4, 1), Activation("tanh"), Flatten(), Dense(4, 2)])
    mlp = MLP([3, 4, 2], activation="tanh", likelihood="categorical")
    assert cnn.D == mlp.D == 26
    perm = np.concatenate([np.arange(12).reshape(3, 4).T.reshape(-1), np.arange(12, 26)])
    # theta_cnn = theta_mlp[perm]: conv entry (o, c) at o 3 + c holds W[c, o] at c 4 + o
    k = (2, 1)
    assert ktied.layout(cnn, k)._replace(sizes=None, conv=None) == \
        ktied.layout(mlp, k)._replace(sizes=None, conv=None)
    s_mlp = _start(mlp, k)
    s_cnn = s_mlp._replace(mu=s_mlp.mu[perm])
    assert_close(ktied.std(s_cnn, cnn), ktied.std(s_mlp, mlp)[perm], EXACT_F64, "sigma")
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((N, 3)), rng.integers(0, 2, N)
    cfg = ktied.KTiedConfig(N, 1.0, alpha=0.05)
    for t in range(2):
        eps = rng.standard_normal((26, 2))
        s_mlp, i_mlp = ktied.step(s_mlp, ktied.Batch(X[:M], y[:M]), eps, cfg, mlp)
        s_cnn, i_cnn = ktied.step(s_cnn, ktied.Batch(X[:M], y[:M]), eps[perm], cfg, cnn)
        assert_close(i_cnn.grad_rho, i_mlp.grad_rho, EXACT_F64, f"dF/drho, step {t}")
        assert_close(s_cnn.mu, s_mlp.mu[perm], EXACT_F64, f"mu, step {t}")
        assert_close(s_cnn.rho, s_mlp.rho, EXACT_F64, f"rho, step {t}")


@pytest.mark.parametrize("kind", ["tiny", "two-conv"])
def test_layout_counts_and_bad_ranks(kind):
    model = _MODELS[kind]()
    lay = ktied.layout(model, 1)
    spec = LoopSpec(model)
    shapes = [(f["c_in"] * f["kernel"][0] * f["kernel"][1], f["c_out"], f["bias"]) if t == "Conv2d"
              else (f["n_in"], f["n_out"], f["bias"]) for t, f in spec.layers
              if t in ("Conv2d", "Dense")]
    assert lay.shapes == tuple((m, n) for m, n, _ in shapes)
    assert lay.conv == tuple(t == "Conv2d" for t, _ in spec.layers if t in ("Conv2d", "Dense"))
    assert lay.sizes is None and lay.D == model.D
    # (ktied.10) with m = Q, n = C_out
    assert lay.P == sum(m + n + (n if b else 0) for m, n, b in shapes)
    assert ktied.n_variational_params(model, 2) == model.D + sum(
        2 * (m + n) + (n if b else 0) for m, n, b in shapes)
    assert ktied.n_variational_params(model) == 2 * model.D
    with pytest.raises(ValueError, match="k: expected"):
        ktied.layout(model, (1,) * (len(shapes) + 1))
    with pytest.warns(UserWarning, match=r"layer 0 \("):  # first conv's cap min(Q, C_out)
        ktied.layout(model, (shapes[0][1] + 1,) + (1,) * (len(shapes) - 1))


@pytest.mark.parametrize("kind", ["tiny", "two-conv"])
def test_init_kl_entropy_and_density_are_the_diagonal_gaussians(kind):
    # (ktied.8) on a CNN, and (ktied.4) with sigma of (ktied.16)
    model, k = _MODELS[kind](), _K[kind]
    P = ktied.layout(model, k).P
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = ktied.init(np.zeros(model.D), model, k, 0.2, np.zeros(P))
    assert_close(ktied.std(flat, model), np.full(model.D, 0.2), EXACT_F64, "sigma0")
    state, spec = _start(model, k), LoopSpec(model)
    sigma = np.asarray(_sigma_loops(_factors(state.rho, spec, k), spec))
    lam = np.linspace(0.5, 2.0, model.D)
    kl = 0.5 * np.sum(lam * (sigma ** 2 + state.mu ** 2) - 1 - np.log(lam * sigma ** 2))
    assert_close(ktied.kl_divergence(state, model, lam), kl, EXACT_F64, "KL")
    H = 0.5 * np.sum(np.log(2 * math.pi * math.e * sigma ** 2))
    assert_close(ktied.entropy(state, model), H, EXACT_F64, "entropy")
    x = state.mu + sigma * np.random.default_rng(6).standard_normal(model.D)
    logq = -0.5 * np.sum(((x - state.mu) / sigma) ** 2 + np.log(2 * math.pi * sigma ** 2))
    assert_close(ktied.log_density(state, model, x), logq, EXACT_F64, "log q")
    assert_close(np.diag(ktied.dense_covariance(state, model)), sigma ** 2, EXACT_F64, "cov")


@pytest.mark.parametrize("kind", ["tiny", "two-conv"])
def test_from_mean_field_and_truncation_read_the_im2col_matrix(kind):
    # (ktied.11), (ktied.13) on A_l (Q, C_out) of (ktied.16)
    model = _MODELS[kind]()
    rng = np.random.default_rng(7)
    mu, sigma = rng.standard_normal(model.D), rng.uniform(0.1, 1.0, model.D)
    state = ktied.from_mean_field(mu, sigma, model)
    lay = ktied.layout(model, state.k)
    assert state.k == tuple(min(m, n) for m, n in lay.shapes)
    assert_close(ktied.std(state, model), sigma, EXACT_F64, "std of the converted posterior")
    out = ktied.truncate_sigma(sigma, model, 1)
    expect = sigma.copy()
    for l, ((m, n), conv) in enumerate(zip(lay.shapes, lay.conv)):
        w0 = lay.w_theta[l]
        # A[q, o] = sigma[w0 + o Q + q] for a conv, A[i, j] = sigma[w0 + i n + j] for a dense
        A = np.array([[sigma[w0 + (j * m + i if conv else i * n + j)] for j in range(n)]
                      for i in range(m)])
        U, g, Vt = np.linalg.svd(A)
        A1 = np.abs(g[0] * np.outer(U[:, 0], Vt[0]))
        for i in range(m):
            for j in range(n):
                expect[w0 + (j * m + i if conv else i * n + j)] = A1[i, j]
    assert_close(out, expect, EXACT_F64, "rank-1 truncation")


def test_evaluate_takes_a_cnn():
    # (ktied.14) on a CNN: the -ELBO and NLL of the same draws by the model's own passes
    model = tiny_cnn()
    X, y = _problem(model)
    state = _start(model, 1)
    sigma = ktied.std(state, model)
    eps = np.random.default_rng(8).standard_normal((model.D, 2))
    ev = ktied.evaluate(state.mu, sigma, model, ktied.Batch(X, y), ktied.Batch(X[:4], y[:4]),
                        eps, 1.0)
    thetas = state.mu[:, None] + sigma[:, None] * eps
    loss = sum(model.per_example_losses(thetas[:, s], X, y).sum() for s in range(2)) / 2
    kl = float(ktied.kl_divergence(state, model, 1.0))
    assert_close(ev.kl, kl, EXACT_F64, "KL")
    assert_close(ev.neg_elbo, (loss + kl) / N, EXACT_F64, "-ELBO / N")
    probs = sum(model.predict(thetas[:, s], X[:4]) for s in range(2)) / 2
    assert_close(ev.nll, -np.mean(np.log(probs[np.arange(4), y[:4]])), EXACT_F64, "NLL")
