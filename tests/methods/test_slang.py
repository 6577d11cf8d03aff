"""SLANG (refbayes.methods.slang) against a dense re-implementation, the full-Gaussian EF step it
reduces to, and the printed lines of Algorithm 1 (errata, derivations/slang.md)."""
import numpy as np
import pytest

from refbayes.datasets import make_logistic_regression
from refbayes.linalg import lowrank
from refbayes.methods import ngvi, slang
from refbayes.models import MLP, LogisticRegression, add_intercept
from tests.reference import ngvi_dense as ref
from tests.tolerances import CONVERGED, EXACT_F32, EXACT_F64, assert_close

N, P, M = 40, 5, 8
D = P + 1
LAM = np.array([1.0, 0.5, 2.0, 1.0, 0.3, 1e-2])


def _problem(seed=0):
    s = make_logistic_regression(N, P, seed)
    return s.X, s.y.astype(float), LogisticRegression(P)


def _start(L, seed=1):
    rng = np.random.default_rng(seed)
    return slang.init(0.3 * rng.standard_normal(D), 0.5 * rng.standard_normal((D, L)),
                      rng.uniform(0.5, 1.5, D))


def _batches(steps, S, seed=2):
    rng = np.random.default_rng(seed)
    return [(rng.permutation(N)[:M], rng.standard_normal((D, S))) for _ in range(steps)]


@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("decay", [0.0, 0.51])
@pytest.mark.parametrize("L", [1, 3])
def test_steps_match_dense_reimplementation(L, decay, momentum, S):
    """Five consecutive steps with the same eps and minibatches: U U^T, d, mu, Delta_d and the
    draws agree with explicit D x D algebra to 1e-10."""
    # checks (slang.8), (slang.6)
    X, y, model = _problem()
    cfg = slang.SLANGConfig(N, LAM, L=L, alpha=0.3, beta=0.2, decay=decay, momentum=momentum)
    state = _start(L)
    mu, UUt, d, g_bar = state.mu, state.U @ state.U.T, state.d, np.zeros(D)
    for t, (idx, eps) in enumerate(_batches(5, S)):
        theta = ref.symmetric_root_draw(mu, state.U, d, eps)
        state, info = slang.step(state, slang.Batch(X[idx], y[idx]), eps, cfg, model)
        mu, UUt, d, g_bar, Delta_d = ref.slang_step(
            mu, UUt, d, g_bar, t, theta, add_intercept(X[idx]), y[idx], N, LAM, L,
            0.3, 0.2, decay, momentum)
        assert_close(info.theta, theta, EXACT_F64, f"line 4, step {t}")
        assert_close(state.U @ state.U.T, UUt, EXACT_F64, f"U U^T, step {t}")
        assert_close(info.Delta_d, Delta_d, EXACT_F64, f"Delta_d, step {t}")
        assert_close(state.d, d, EXACT_F64, f"d, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")
    assert state.t == 5


@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("L", [1, 3])
def test_official_forward_takes_the_gradients_at_mean_plus_draw(L, S):
    """(slang.9): forward="mean+draw" is the dense step whose gradients are taken at
    w_s = mu + theta_s, the draws theta_s of q and everything else unchanged (five steps, 1e-10);
    the default "draw" is a different step from the same inputs."""
    X, y, model = _problem()
    cfg = slang.SLANGConfig(N, LAM, L=L, alpha=0.3, beta=0.2, decay=0.0, momentum=0.9,
                            forward="mean+draw")
    state = _start(L)
    mu, UUt, d, g_bar = state.mu, state.U @ state.U.T, state.d, np.zeros(D)
    for t, (idx, eps) in enumerate(_batches(5, S)):
        theta = ref.symmetric_root_draw(mu, state.U, d, eps)
        batch = slang.Batch(X[idx], y[idx])
        default, _ = slang.step(state, batch, eps, cfg._replace(forward="draw"), model)
        state, info = slang.step(state, batch, eps, cfg, model)
        mu, UUt, d, g_bar, Delta_d = ref.slang_step(
            mu, UUt, d, g_bar, t, mu[:, None] + theta, add_intercept(X[idx]), y[idx], N, LAM, L,
            0.3, 0.2, 0.0, 0.9)
        assert_close(info.theta, theta, EXACT_F64, f"draws of q, step {t}")
        assert_close(state.U @ state.U.T, UUt, EXACT_F64, f"U U^T, step {t}")
        assert_close(state.d, d, EXACT_F64, f"d, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")
        assert _rel(default.mu, state.mu) > 1e-6


def _full_from(state):
    P_full = lowrank.dense_precision(state.U, state.d)
    return ngvi.FullState(state.mu, P_full, state.g_bar, state.t), np.linalg.cholesky(P_full)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_full_rank_slang_is_the_full_gaussian_ef_step(momentum):
    """(slang.2)-(slang.4) with L = D (and L + M S >= D): the truncation keeps all of W W^T, so
    the step is (ngvi.4)-(ngvi.5) with the EF, fed the same draw (eps_full = L_P^T (theta - mu));
    Delta_d = 0 up to rounding: |Delta_d| <= 1e-12 max diag(W W^T) (sums of D products ~1e-16)."""
    X, y, model = _problem()
    scfg = slang.SLANGConfig(N, LAM, L=D, alpha=0.3, beta=0.2, decay=0.51, momentum=momentum)
    fcfg = ngvi.NGVIConfig(N, LAM, alpha=0.3, beta=0.2, decay=0.51, curvature="ef",
                           momentum=momentum)
    state = _start(D)
    full, _ = _full_from(state)
    for idx, eps in _batches(4, 2):
        batch = slang.Batch(X[idx], y[idx])
        L_P = np.linalg.cholesky(full.Sigma_inv)
        theta = slang.sample(state, eps)
        eps_full = L_P.T @ (theta - state.mu[:, None])
        state, info = slang.step(state, batch, eps, scfg, model)
        full, finfo = ngvi.step_full(full, batch, eps_full, fcfg, model)
        assert_close(finfo.theta, info.theta, EXACT_F64, "same draws")
        scale = np.max(np.sum(info.W ** 2, axis=1))
        assert np.max(np.abs(info.Delta_d)) <= 1e-12 * scale
        assert_close(lowrank.dense_precision(state.U, state.d), full.Sigma_inv, EXACT_F64,
                     "precision")
        assert_close(state.mu, full.mu, EXACT_F64, "mean")


@pytest.mark.parametrize("L", [1, 2, 4])
def test_diagonal_of_the_precision_matches_the_full_ef_step(L):
    """diag(U' U'^T + diag d') = diag of the full EF update from the same q and draws, for any L
    (what Delta_d is for, (slang.3))."""
    X, y, model = _problem()
    cfg = slang.SLANGConfig(N, LAM, L=L, alpha=0.3, beta=0.2, decay=0.0)
    fcfg = ngvi.NGVIConfig(N, LAM, alpha=0.3, beta=0.2, decay=0.0, curvature="ef")
    state = _start(L)
    (idx, eps), = _batches(1, 3)
    full, L_P = _full_from(state)
    theta = slang.sample(state, eps)
    new, _ = slang.step(state, slang.Batch(X[idx], y[idx]), eps, cfg, model)
    fnew, _ = ngvi.step_full(full, slang.Batch(X[idx], y[idx]), L_P.T @ (theta - state.mu[:, None]),
                             fcfg, model)
    assert_close(np.diag(lowrank.dense_precision(new.U, new.d)), np.diag(fnew.Sigma_inv),
                 EXACT_F64, "diagonal")


def test_randomized_fast_eig_with_full_rank_sketch_equals_exact():
    """eig='randomized' with L + p >= rank(W): the Rayleigh-Ritz step recovers [W W^T]_L exactly."""
    X, y, model = _problem()
    L, S = 2, 1
    state = _start(L)
    (idx, eps), = _batches(1, S)
    K = L + M * S
    Omega = np.random.default_rng(5).standard_normal((K, K))
    batch = slang.Batch(X[idx], y[idx])
    exact, _ = slang.step(state, batch, eps, slang.SLANGConfig(N, LAM, L=L), model)
    rand, _ = slang.step(state, batch, eps,
                         slang.SLANGConfig(N, LAM, L=L, eig="randomized", n_iter=1), model,
                         Omega=Omega)
    assert_close(rand.U @ rand.U.T, exact.U @ exact.U.T, EXACT_F64, "U U^T")
    assert_close(rand.d, exact.d, EXACT_F64, "d")
    assert_close(rand.mu, exact.mu, EXACT_F64, "mu")


def test_alg3_sampler_draws_from_the_same_gaussian():
    """sampler='alg3' (the poster's Algorithm 3, corrected) is another root of P^{-1}: fed the
    identity as eps, S S^T = P^{-1} for both samplers, while the draws differ."""
    state = _start(3)
    I = np.eye(D)
    Sigma = lowrank.dense_covariance(state.U, state.d)
    for sampler in slang.SAMPLERS:
        R = slang.sample(state, I, sampler) - state.mu[:, None]
        assert_close(R @ R.T, Sigma, EXACT_F64, sampler)
    assert not np.allclose(slang.sample(state, I, "alg3"), slang.sample(state, I))


def test_default_sampler_is_a_nonsymmetric_root():
    """(slang.7) sampler="symmetric" is S = d^{-1/2} (I + V V^T)^{-1/2}: only the inner factor is
    symmetric. Fed eps = I (mu = 0) sample returns S; S S^T = P^{-1} to 1e-10, while S != S^T,
    S^T S != P^{-1} and S != P^{-1/2} (the symmetric root) by more than 10%, with d spread over
    [0.2, 5]."""
    rng = np.random.default_rng(4)
    state = slang.init(np.zeros(D), rng.standard_normal((D, 2)), np.linspace(0.2, 5.0, D))
    S = slang.sample(state, np.eye(D))
    Sigma = slang.dense_covariance(state)
    assert_close(S @ S.T, Sigma, EXACT_F64, "S S^T")
    w, Q = np.linalg.eigh(Sigma)
    assert _rel(S, S.T) > 1e-1
    assert _rel(S.T @ S, Sigma) > 1e-1
    assert _rel(S, (Q * np.sqrt(w)) @ Q.T) > 1e-1



def test_dense_precision_and_covariance_are_the_printed_q():
    """(slang.1): dense_precision is U U^T + diag(d) written out, dense_covariance its explicit
    inverse (the code forms it by Woodbury), for a state with L = 3 < D and d spread out."""
    rng = np.random.default_rng(6)
    state = slang.init(rng.standard_normal(D), rng.standard_normal((D, 3)),
                       np.linspace(0.2, 5.0, D))
    P = state.U @ state.U.T + np.diag(state.d)
    assert_close(slang.dense_precision(state), P, EXACT_F64, "P = U U^T + diag(d)")
    assert_close(slang.dense_covariance(state), np.linalg.inv(P), EXACT_F64, "Sigma = P^{-1}")

def test_float32_step_matches_float64():
    X, y, model = _problem()
    state = _start(2)
    (idx, eps), = _batches(1, 2)
    cfg64 = slang.SLANGConfig(N, LAM, L=2, alpha=0.3, beta=0.2)
    new64, _ = slang.step(state, slang.Batch(X[idx], y[idx]), eps, cfg64, model)
    s32 = slang.SLANGState(*[a.astype(np.float32) if hasattr(a, "dtype") else a for a in state])
    cfg32 = cfg64._replace(lam=LAM.astype(np.float32))
    new32, _ = slang.step(s32, slang.Batch(X[idx].astype(np.float32), y[idx].astype(np.float32)),
                          eps.astype(np.float32), cfg32, model)
    assert new32.mu.dtype == np.float32 and new32.U.dtype == np.float32
    assert_close(new32.U @ new32.U.T, new64.U @ new64.U.T, EXACT_F32, "U U^T")
    assert_close(new32.d, new64.d, EXACT_F32, "d")
    assert_close(new32.mu, new64.mu, EXACT_F32, "mu")


def test_state_and_info_contract():
    X, y, model = _problem()
    L, S = 2, 3
    state = _start(L)
    (idx, eps), = _batches(1, S)
    new, info = slang.step(state, slang.Batch(X[idx], y[idx]), eps, slang.SLANGConfig(N, LAM, L=L),
                           model)
    shapes = dict(theta=(D, S), G=(S, M, D), W=(D, L + M * S), U=(D, L), Delta_d=(D,), d=(D,),
                  g_tilde=(D,), direction=(D,), Delta_mu=(D,), mu=(D,))
    for name, shape in shapes.items():
        assert getattr(info, name).shape == shape, name
        assert getattr(info, name).dtype == np.float64, name
    assert new.U.shape == (D, L) and new.t == 1
    assert_close(info.mu, state.mu - info.alpha_t * info.Delta_mu, EXACT_F64, "line 13")


# ----------------------------------------------------------------------------- errata

def _one_step_setup(L=2, S=2):
    X, y, model = _problem()
    state = _start(L)
    (idx, eps), = _batches(1, S)
    theta = slang.sample(state, eps)
    cfg = slang.SLANGConfig(N, LAM, L=L, alpha=0.3, beta=0.2, decay=0.0)
    new, info = slang.step(state, slang.Batch(X[idx], y[idx]), eps, cfg, model)
    args = (state.mu, state.U @ state.U.T, state.d, np.zeros(D), 0, theta, add_intercept(X[idx]),
            y[idx], N, LAM, L, 0.3, 0.2, 0.0)
    return new, info, args


def _rel(a, b):
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


def test_erratum_line7_columns():
    """Printed line 7: fast_eig(delta u_1..u_L, beta g_1..g_M); corrected: columns sqrt(delta) u_j,
    sqrt(beta N / (M S)) g (slang.2). The printed columns truncate a different matrix."""
    new, _, args = _one_step_setup()
    printed = ref.slang_step(*args, line7="printed")
    corrected = ref.slang_step(*args)
    assert_close(new.U @ new.U.T, corrected[1], EXACT_F64, "library vs corrected")
    assert _rel(printed[1], corrected[1]) > 1e-1


def test_erratum_line8_scale():
    """Printed line 8: ... + sum_i beta g_i^2 ...; corrected: beta (N / (M S)) sum g^2 (slang.3).
    Without the factor Delta_d is not the diagonal of the truncation residual."""
    _, info, args = _one_step_setup()
    printed = ref.slang_step(*args, line8_scaled=False)
    corrected = ref.slang_step(*args)
    assert_close(info.Delta_d, corrected[4], EXACT_F64, "library vs corrected")
    assert _rel(printed[4], corrected[4]) > 1e-1


def test_erratum_line10_prior():
    """Printed line 10: d <- delta d + Delta_d + lambda 1; corrected: + beta lambda (slang.4),
    the weighting (ngvi.4) gives the prior. The printed d is lambda (1 - beta) too large."""
    new, _, args = _one_step_setup()
    printed = ref.slang_step(*args, line10_beta=False)
    corrected = ref.slang_step(*args)
    assert_close(new.d, corrected[2], EXACT_F64, "library vs corrected")
    assert _rel(printed[2], corrected[2]) > 1e-2


def test_erratum_line11_scale():
    """Printed line 11: g <- sum_i g_i + lambda mu; corrected: (N / (M S)) sum g + lambda mu
    (slang.5). With M < N the printed mean step differs."""
    new, _, args = _one_step_setup()
    printed = ref.slang_step(*args, line11_scaled=False)
    corrected = ref.slang_step(*args)
    assert_close(new.mu, corrected[0], EXACT_F64, "library vs corrected")
    assert _rel(printed[0], corrected[0]) > 1e-2


def test_erratum_vogn_curvature_scale():
    """Poster VOGN: G = (1/M) sum g_i g_i^T with lambda unscaled; corrected: (N/M) sum (ngvi.9).
    On Bayesian linear regression (Hessian curvature, beta = 1) the corrected step lands on the
    posterior; with the printed 1/M scaling of the data terms it does not (the prior is N times
    too strong relative to the data). slang.step itself, iterated with eps = 0, lands on the
    posterior mean with U U^T the top-L part of the corrected G, and on the printed mean when its
    data terms are scaled by 1/N."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, P))
    y = X @ rng.standard_normal(P) + 0.1 * rng.standard_normal(N)
    tau = 4.0
    model = MLP([P, 1], likelihood="gaussian", noise_precision=tau)
    Xd = add_intercept(X)
    Prec = tau * Xd.T @ Xd + np.diag(LAM)
    post_mu = np.linalg.solve(Prec, tau * Xd.T @ y)
    cfg = ngvi.NGVIConfig(N, LAM, alpha=1.0, beta=1.0, decay=0.0, curvature="exact")
    state = ngvi.init_full(np.zeros(D), np.eye(D))
    new, _ = ngvi.step_full(state, ngvi.Batch(X, y), None, cfg, model)
    assert_close(new.mu, post_mu, EXACT_F64, "corrected")
    # printed: the data terms carry 1/M (= 1/N at full batch) instead of N/M (= 1)
    Prec_printed = (tau * Xd.T @ Xd) / N + np.diag(LAM)
    mu_printed = np.linalg.solve(Prec_printed, tau * Xd.T @ y / N)
    assert _rel(mu_printed, post_mu) > 1e-2
    assert _rel(Prec_printed, Prec) > 1e-1

    # SLANG itself (slang.step, L = 2, beta = 1, full batch M = N, eps = 0 so theta = mu): its
    # data terms carry N / (M S) = 1. Started at the printed answer, its mean leaves it and lands
    # on the posterior mean, and its low-rank factor is the top-L part of the corrected
    # G = (N / M) sum_i g_i g_i^T at that mean, not of the printed (1 / M) sum_i g_i g_i^T.
    # alpha = 0.015: near the fixed point the EF preconditioner is ~25 times smaller than the
    # Hessian here (residuals 0.1 against tau_n = 4), and the iteration is stable for alpha < 0.024.
    L, zero = 2, np.zeros((D, 1))
    scfg = slang.SLANGConfig(N, LAM, L=L, alpha=0.015, beta=1.0, decay=0.0)
    st = slang.init(mu_printed, np.zeros((D, L)), np.ones(D))
    for _ in range(400):  # reaches 1e-15 in ~160 steps
        st, _ = slang.step(st, slang.Batch(X, y), zero, scfg, model)
    assert_close(st.mu, post_mu, CONVERGED, "slang.step vs the posterior mean")
    F = tau * (Xd @ post_mu - y)[:, None] * Xd  # per-example gradients at the posterior mean
    assert_close(st.U @ st.U.T, ref.top_L(F.T @ F, L), CONVERGED, "U U^T vs [(N/M) sum g g^T]_L")
    assert _rel(ref.top_L(F.T @ F / N, L), st.U @ st.U.T) > 1e-1
    # The printed data scale, reproduced through the package: at full batch (1/M) sum_i g_i is
    # (N/M) sum_i g_i of the model with noise precision tau / N (g is linear in tau_n), so the
    # same step on that model, started at the posterior mean, leaves it for the printed mean.
    model_printed = MLP([P, 1], likelihood="gaussian", noise_precision=tau / N)
    st = slang.init(post_mu, np.zeros((D, L)), np.ones(D))
    for _ in range(1000):  # reaches 1e-15 in ~520 steps
        st, _ = slang.step(st, slang.Batch(X, y), zero, scfg, model_printed)
    assert_close(st.mu, mu_printed, CONVERGED, "slang.step at the printed scale")


# ----------------------------------------------------------------------------- bad input

def _good():
    X, y, model = _problem()
    state = _start(2)
    (idx, eps), = _batches(1, 1)
    return dict(state=state, batch=slang.Batch(X[idx], y[idx]), eps=eps,
                cfg=slang.SLANGConfig(N, LAM, L=2), model=model)


def _call(**over):
    kw = _good()
    kw.update(over)
    omega = kw.pop("Omega", None)
    return slang.step(kw["state"], kw["batch"], kw["eps"], kw["cfg"], kw["model"], Omega=omega)


_CFG = slang.SLANGConfig(N, LAM, L=2)
_BAD = [
    (dict(cfg=_CFG._replace(alpha=0.0)), r"alpha: expected a value in \(0.0, 1.0\]"),
    (dict(cfg=_CFG._replace(alpha=1.5)), "alpha"),
    (dict(cfg=_CFG._replace(beta=0.0)), "beta"),
    (dict(cfg=_CFG._replace(beta=1.01)), "beta"),
    (dict(cfg=_CFG._replace(L=0)), "L: expected an integer in"),
    (dict(cfg=_CFG._replace(L=D + 1)), "L: expected an integer in"),
    (dict(cfg=_CFG._replace(L=3)), "L: expected the state's rank 2"),
    (dict(cfg=_CFG._replace(lam=np.where(np.arange(D) == 2, 0.0, 1.0))), "lam: expected > 0"),
    (dict(cfg=_CFG._replace(lam=-np.ones(D))), "lam: expected > 0"),
    (dict(cfg=_CFG._replace(lam=np.ones(D - 1))), "lam: expected shape"),
    (dict(cfg=_CFG._replace(eig="lanczos")), "eig: expected one of"),
    (dict(cfg=_CFG._replace(forward="mean")), "forward: expected one of"),
    (dict(cfg=_CFG._replace(N=4)), r"batch.X: expected 1 <= M <= N = 4"),
    (dict(eps=np.ones((D + 1, 1))), r"eps: expected shape \(D, S\)"),
    (dict(eps=None), "eps: .* needs standard-normal draws"),
    (dict(eps=np.ones((D, 1), dtype=np.float32)), "eps: expected dtype float64"),
    (dict(Omega=np.ones((10, 4))), "Omega: only used by eig='randomized'"),
    (dict(cfg=_CFG._replace(eig="randomized")), "Omega: eig='randomized' needs"),
    (dict(batch=slang.Batch(np.ones((3, P)), np.array([0.0, 2.0, 1.0]))),
     r"batch.y: expected binary labels in \{0, 1\}"),
    (dict(batch=slang.Batch(np.ones((0, P)), np.ones(0))), "batch.X: expected 1 <= M"),
    (dict(model=LogisticRegression(P + 1)), "model: expected a model with D = 6"),
    (dict(state=slang.SLANGState(np.zeros(D), np.zeros((D, 2)), np.zeros(D), np.zeros(D), 0)),
     "state.d: expected > 0"),
]


@pytest.mark.parametrize("over, match", _BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(_BAD)])
def test_bad_input_raises(over, match):
    with pytest.raises(ValueError, match=match):
        _call(**over)


def test_init_rejects_bad_factors():
    with pytest.raises(ValueError, match="d: expected > 0"):
        slang.init(np.zeros(D), np.zeros((D, 1)), -np.ones(D))
    with pytest.raises(ValueError, match=r"L \(columns of U\)"):
        slang.init(np.zeros(D), np.zeros((D, 0)), np.ones(D))


@pytest.mark.parametrize("sampler", ["symmetric", "alg3"])
def test_sample_draws_are_the_printed_map(sampler):
    """Draw by draw, written out here with dense D x D algebra, V = d^{-1/2} U:
    "symmetric" theta = mu + d^{-1/2} (I + V V^T)^{-1/2} eps (the symmetric root by eigh);
    "alg3" theta = mu + d^{-1/2} W0^{-T} eps, W0 = I + V X V^T, X = A^{-T} (B - I) A^{-1},
    A A^T = V^T V, B B^T = I + A^T A (lower Cholesky, explicit inverses). The covariance tests
    above see only S S^T, which a sign flip of the perturbation, W0^{-1} in place of W0^{-T}
    or d^{-1/2} applied on the other side leave unchanged (or nearly); this test does not."""
    # checks (slang.7), (lowrank.8), (lowrank.12)
    rng = np.random.default_rng(8)
    state = slang.init(rng.standard_normal(D), rng.standard_normal((D, 3)),
                       np.linspace(0.2, 5.0, D))
    eps = np.hstack([rng.standard_normal((D, 3)), np.eye(D)])
    V = state.U / np.sqrt(state.d)[:, None]
    if sampler == "symmetric":
        w, Q = np.linalg.eigh(np.eye(D) + V @ V.T)
        root = (Q / np.sqrt(w)) @ Q.T  # (I + V V^T)^{-1/2}  (lowrank.8)
    else:
        A = np.linalg.cholesky(V.T @ V)
        B = np.linalg.cholesky(np.eye(3) + A.T @ A)
        A_inv = np.linalg.inv(A)
        X = A_inv.T @ (B - np.eye(3)) @ A_inv
        root = np.linalg.inv(np.eye(D) + V @ X @ V.T).T  # W0^{-T}  (lowrank.12)
    by_hand = state.mu[:, None] + (root @ eps) / np.sqrt(state.d)[:, None]  # (slang.7)
    assert_close(slang.sample(state, eps, sampler), by_hand, EXACT_F64, sampler)
    assert np.max(np.abs(by_hand - state.mu[:, None])) > 1e-1  # the perturbation is not negligible
