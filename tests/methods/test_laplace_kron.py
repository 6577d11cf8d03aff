"""K-FAC ("kron") and last-layer Laplace (refbayes.methods.laplace, (laplace.18)-(laplace.23)):
the factors against independent per-example pieces, exactness where K-FAC is exact (one row;
Bayesian linear regression), the structured Gaussian against its dense twin (sampling map,
covariance, log-determinant inside the evidence, GLM predictive), the last-layer block against
the whole network's curvature, and bad input."""
import numpy as np
import pytest

from refbayes.linalg import kron
from refbayes.methods import laplace
from refbayes.models import MLP
from tests.reference import laplace_dense as ref
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

# fit here is mostly at points that are not a MAP (the identities tested hold at any theta); its
# non-stationarity UserWarning is tested in test_laplace.py (test_fit_warns_away_from_a_minimum)
pytestmark = pytest.mark.filterwarnings(
    "ignore:laplace.fit. theta_map is not a stationary point:UserWarning")

N = 12


def _mlp(likelihood, n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    if likelihood == "gaussian":
        y = np.sin(X.sum(axis=1)) + 0.1 * rng.standard_normal(n)
        model = MLP([3, 4, 2, 1], activation="tanh", likelihood="gaussian", noise_precision=2.0)
    else:
        y = rng.integers(0, 3, n)
        model = MLP([3, 4, 3], activation="tanh", likelihood="categorical")
    return X, y, model, 0.5 * model.init_theta(np.random.default_rng(seed + 1))


def _layer_delta(model, values):
    """One prior precision per layer block [W_l, b_l] (what 'kron' accepts), per parameter."""
    return laplace.expand_prior_precision(model, np.repeat(np.asarray(values, float), 2))


# ----------------------------------------------------------------------------- the factors

@pytest.mark.parametrize("likelihood", ["gaussian", "categorical"])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_kfac_factors_equal_the_independent_reference(likelihood, curvature):
    """(peg.13): A_l = (1/N) sum a~ a~^T from a forward pass written in the reference, B_l the
    sum of the per-example exact blocks' bias-bias sub-blocks."""
    X, y, model, theta = _mlp(likelihood)
    got = model.kfac_curvature(theta, X, y, curvature)
    want = ref.kfac_reference(model, theta, X, y, curvature)
    assert len(got) == len(want) == model.n_layers
    for l, ((A, B), (A_r, B_r, _)) in enumerate(zip(got, want)):
        assert_close(A, A_r, EXACT_F64, f"A_{l}")
        assert_close(B, B_r, EXACT_F64, f"B_{l}")


@pytest.mark.parametrize("likelihood", ["gaussian", "categorical"])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_kfac_is_exact_for_one_row(likelihood, curvature):
    """With N = 1 the sum of products is one product: A_l kron B_l equals the exact layer block
    of the GGN (model.ggn) or the EF (g g^T)."""
    X, y, model, theta = _mlp(likelihood, n=1)
    H = model.ggn(theta, X, y) if curvature == "ggn" else ref.ef_outer_loop(model, theta, X, y)
    off = 0
    for l, (A, B) in enumerate(model.kfac_curvature(theta, X, y, curvature)):
        size = A.shape[0] * B.shape[0]
        assert_close(kron.dense(A, B), H[off:off + size, off:off + size], EXACT_F64, f"layer {l}")
        off += size
    assert off == model.D


def test_kfac_is_not_exact_for_many_rows():
    """The approximation is real: with N = 12 rows the blocks differ from the exact GGN's (so
    the one-row test above is not vacuous)."""
    X, y, model, theta = _mlp("categorical")
    A, B = model.kfac_curvature(theta, X, y, "ggn")[0]
    exact = ref.kfac_reference(model, theta, X, y, "ggn")[0][2]
    err = np.abs(kron.dense(A, B) - exact).max() / np.abs(exact).max()
    assert err > 1e-3, err


@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_kron_bias_block_is_exact(curvature):
    """(laplace.22): A_l's last diagonal entry is 1, so the bias block of A_l kron B_l is
    sum_i B_i, the exact bias block of the GGN / EF; the W block is A~ kron B_l with
    A~ = (1/N) sum a a^T (laplace-torch's weight factor); only the W-b cross block is K-FAC's."""
    X, y, model, theta = _mlp("categorical")
    H = model.ggn(theta, X, y) if curvature == "ggn" else ref.ef_outer_loop(model, theta, X, y)
    off = 0
    for (A, B), (_, _, exact) in zip(model.kfac_curvature(theta, X, y, curvature),
                                     ref.kfac_reference(model, theta, X, y, curvature)):
        n_w = (A.shape[0] - 1) * B.shape[0]
        size = n_w + B.shape[0]
        assert A[-1, -1] == 1.0
        assert_close(kron.dense(A, B)[n_w:, n_w:], H[off + n_w:off + size, off + n_w:off + size],
                     EXACT_F64, "bias block")
        assert_close(kron.dense(A, B)[n_w:, n_w:], exact[n_w:, n_w:], EXACT_F64, "bias block (ref)")
        assert_close(kron.dense(A, B)[:n_w, :n_w], kron.dense(A[:-1, :-1], B), EXACT_F64, "W block")
        off += size


# ----------------------------------------------------------------------------- BLR: exact

def test_kron_blr_is_the_exact_posterior_and_evidence():
    """Linear regression, scalar prior: every B_i = tau, so K-FAC = (1/N) X~^T X~ kron N tau
    = tau X~^T X~, the exact precision (laplace.8), and the evidence is exact."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((20, 3))
    y = X @ np.array([1.0, -1.0, 0.5]) + 0.2 + 0.5 * rng.standard_normal(20)
    tau, delta = 4.0, 0.8
    model = MLP([3, 1], likelihood="gaussian", noise_precision=tau)
    mean, Prec = ref.blr_posterior(X, y, tau, np.full(model.D, delta))
    cfg = laplace.LaplaceConfig(delta, "kron", "ggn")
    state = laplace.fit(model, mean, X, y, cfg)
    assert_close(laplace.dense_precision(state), Prec, EXACT_F64, "precision")
    assert_close(laplace.dense_covariance(state), np.linalg.inv(Prec), EXACT_F64, "covariance")
    lml = laplace.log_marginal_likelihood(model, state, X, y, cfg)
    exact = ref.blr_log_evidence(X, y, tau, np.full(model.D, delta))
    assert abs(lml - exact) <= EXACT_F64 * abs(exact), (lml, exact)


# ----------------------------------------------------------------------------- the Gaussian

def _kron_state(likelihood="gaussian", curvature="ggn"):
    X, y, model, theta = _mlp(likelihood)
    delta = _layer_delta(model, np.linspace(0.5, 2.0, model.n_layers))
    cfg = laplace.LaplaceConfig(delta, "kron", curvature)
    return X, y, model, theta, cfg, laplace.fit(model, theta, X, y, cfg)


@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_kron_precision_is_blockdiag_of_the_factors(curvature):
    """(laplace.18): the dense precision is blockdiag(A_l kron B_l + delta_l I) with the model's
    factors; its inverse is dense_covariance (laplace.19) and the sampling map's square
    (laplace.20)."""
    X, y, model, theta, cfg, state = _kron_state(curvature=curvature)
    P = laplace.dense_precision(state)
    off = 0
    for (A, B), blk in zip(model.kfac_curvature(theta, X, y, curvature), state.kron):
        size = A.shape[0] * B.shape[0]
        want = kron.dense(A, B) + cfg.prior_precision[off] * np.eye(size)
        assert_close(P[off:off + size, off:off + size], want, EXACT_F64, "block")
        off += size
    assert np.all(P[:4 * 4, 4 * 4 + 4:] == 0.0)  # nothing between the first layer and the rest
    Sigma = np.linalg.inv(P)
    assert_close(laplace.dense_covariance(state), Sigma, EXACT_F64, "covariance")
    R = laplace.sample(state, np.eye(model.D)) - theta[:, None]
    assert_close(R @ R.T, Sigma, EXACT_F64, "R R^T")
    assert_close(laplace.sample(state, np.zeros((model.D, 2))), np.tile(theta[:, None], 2),
                 EXACT_F64, "eps = 0")


def test_kron_draw_does_not_depend_on_the_eigenbasis(monkeypatch):
    """(laplace.20): the draw is Sigma_l^{1/2} eps_l, the symmetric root, so another eigenbasis
    of A_l and B_l (signs flipped, as cuSOLVER's differ from LAPACK's, and a rotation inside a
    repeated eigenvalue) gives the same draw; Q_A (E / sqrt(Lam)) Q_B^T, with the same
    covariance, would not."""
    _, _, model, theta, _, state = _kron_state("gaussian")
    eps = np.random.default_rng(3).standard_normal((model.D, 4))
    want = laplace.sample(state, eps)
    damped_eigh = kron.damped_eigh

    def other_basis(A, B, damping=0.0):
        Q_A, Q_B, Lam = damped_eigh(A, B, damping)
        Q_A, Q_B = Q_A.copy(), Q_B.copy()
        Q_A[:, ::2] *= -1
        Q_B[:, 1::2] *= -1
        return Q_A, Q_B, Lam

    monkeypatch.setattr(kron, "damped_eigh", other_basis)
    got = laplace.sample(state, eps)
    assert_close(got, want, EXACT_F64, "draws in another eigenbasis")
    assert np.max(np.abs(got - theta[:, None])) > 1e-2
    # a repeated eigenvalue: B = 2 I, and any orthonormal Q_B is an eigenbasis of it
    monkeypatch.setattr(kron, "damped_eigh", damped_eigh)
    tied = state._replace(kron=(laplace.KronBlock(np.array([[2.0, 0.5], [0.5, 1.0]]), 2 * np.eye(3)),),
                          n_fixed=model.D - 6, prior_prec=np.full(6, 1.3))
    want = laplace.sample(tied, eps[:6])
    rot = np.linalg.qr(np.random.default_rng(4).standard_normal((3, 3)))[0]

    def rotated(A, B, damping=0.0):
        Q_A, Q_B, Lam = damped_eigh(A, B, damping)
        return Q_A, Q_B @ rot, Lam

    monkeypatch.setattr(kron, "damped_eigh", rotated)
    assert_close(laplace.sample(tied, eps[:6]), want, EXACT_F64, "draws in a rotated eigenbasis")


def test_kron_evidence_equals_laplace_torch_form():
    """(laplace.5) with log det from the eigenvalues (laplace.19) equals (laplace.6) with the
    dense precision's slogdet."""
    X, y, model, theta, cfg, state = _kron_state("categorical")
    lml = laplace.log_marginal_likelihood(model, state, X, y, cfg)
    other = ref.laplace_torch_lml(-model.loss(theta, X, y), laplace.dense_precision(state),
                                  cfg.prior_precision, theta)
    assert abs(lml - other) <= EXACT_F64 * abs(other), (lml, other)


def test_kron_glm_predictive_matches_dense():
    """(laplace.21): J Sigma J^T through the eigenbases equals the dense product."""
    X, y, model, theta, cfg, state = _kron_state("gaussian")
    X_star = np.random.default_rng(9).standard_normal((5, 3))
    pred = laplace.glm_predictive(model, state, X_star)
    J = model.jacobian(theta, X_star)
    Sigma = np.linalg.inv(laplace.dense_precision(state))
    assert_close(pred.f_var, np.einsum("mkd,de,mle->mkl", J, Sigma, J), EXACT_F64, "f_var")


def test_kron_float32_matches_float64():
    X, y, model, theta, cfg, s64 = _kron_state("categorical")
    cfg32 = cfg._replace(prior_precision=cfg.prior_precision.astype(np.float32))
    s32 = laplace.fit(model, theta.astype(np.float32), X.astype(np.float32), y, cfg32)
    assert s32.kron[0].A.dtype == np.float32
    assert_close(laplace.dense_covariance(s32), laplace.dense_covariance(s64), EXACT_F32, "Sigma")


# ----------------------------------------------------------------------------- last layer

@pytest.mark.parametrize("likelihood", ["gaussian", "categorical"])
@pytest.mark.parametrize("curvature", ["hessian", "ggn", "ef"])
def test_last_layer_precision_is_the_networks_block(likelihood, curvature):
    """(laplace.23): the head's curvature on the features is the exact last-layer block of the
    whole network's Hessian / GGN / EF (the loss reaches W_L, b_L only through the head)."""
    # checks (peg.15)
    X, y, model, theta = _mlp(likelihood)
    H = {"hessian": model.hessian, "ggn": model.ggn,
         "ef": lambda *a: ref.ef_outer_loop(model, *a)}[curvature](theta, X, y)
    head, _ = model.last_layer(theta, X)
    off = model.D - head.D
    delta = np.linspace(0.5, 1.5, head.D)
    state = laplace.fit(model, theta, X, y,
                        laplace.LaplaceConfig(delta, "full", curvature, "last_layer"))
    assert state.n_fixed == off
    assert_close(laplace.dense_precision(state), H[off:, off:] + np.diag(delta), EXACT_F64,
                 "precision")
    diag = laplace.fit(model, theta, X, y,
                       laplace.LaplaceConfig(delta, "diag", curvature, "last_layer"))
    assert_close(diag.prec_diag, np.diag(H)[off:] + delta, EXACT_F64, "diag")


def test_last_layer_sample_evidence_and_predictive():
    """Sampling moves only the last layer's entries (covariance = inverse of the block); the
    evidence is (laplace.6) over the last layer's parameters (laplace-torch's last-layer
    form); the GLM predictive uses the last layer's Jacobian columns only."""
    X, y, model, theta = _mlp("gaussian")
    cfg = laplace.LaplaceConfig(0.7, "full", "ggn", "last_layer")
    state = laplace.fit(model, theta, X, y, cfg)
    off, Dq = state.n_fixed, model.D - state.n_fixed
    Th = laplace.sample(state, np.eye(Dq))
    assert np.all(Th[:off] == theta[:off, None])
    R = Th[off:] - theta[off:, None]
    Sigma = np.linalg.inv(laplace.dense_precision(state))
    assert_close(R @ R.T, Sigma, EXACT_F64, "R R^T")
    lml = laplace.log_marginal_likelihood(model, state, X, y, cfg)
    other = ref.laplace_torch_lml(-model.loss(theta, X, y), laplace.dense_precision(state),
                                  np.full(Dq, 0.7), theta[off:])
    assert abs(lml - other) <= EXACT_F64 * abs(other), (lml, other)
    X_star = np.random.default_rng(5).standard_normal((4, 3))
    J = model.jacobian(theta, X_star)[:, :, off:]
    pred = laplace.glm_predictive(model, state, X_star)
    assert_close(pred.f_var, np.einsum("mkd,de,mle->mkl", J, Sigma, J), EXACT_F64, "f_var")


def test_last_layer_kron_is_the_heads_kfac():
    """Last layer plus kron: one K-FAC block, the head's factors on the features."""
    X, y, model, theta = _mlp("categorical")
    state = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(2.0, "kron", "ggn", "last_layer"))
    head, phi = model.last_layer(theta, X)
    (A, B), = head.kfac_curvature(theta[state.n_fixed:], phi, y, "ggn")
    assert len(state.kron) == 1
    assert_close(laplace.dense_precision(state), kron.dense(A, B) + 2.0 * np.eye(head.D),
                 EXACT_F64, "precision")


# ----------------------------------------------------------------------------- bad input

# LaplaceConfig(...) refuses the first and third itself; _replace (not re-validated) builds them
# so that fit's own check is tested
@pytest.mark.parametrize("cfg, match", [
    (laplace.LaplaceConfig(1.0, "kron")._replace(curvature="hessian"),
     r"cfg\.curvature: structure 'kron'"),
    (laplace.LaplaceConfig(np.linspace(1.0, 2.0, 31), "kron"), r"one prior precision per layer"),
    (laplace.LaplaceConfig(1.0, "full", "ggn")._replace(subset="first_layer"),
     r"cfg\.subset: expected one of"),
    (laplace.LaplaceConfig(np.ones(31), "full", "ggn", "last_layer"),
     r"cfg\.prior_precision: expected shape \(15\)"),
], ids=["kron-hessian", "kron-delta", "subset", "ll-delta-shape"])
def test_bad_config_raises(cfg, match):
    X, y, model, theta = _mlp("categorical")
    with pytest.raises(ValueError, match=match):
        laplace.fit(model, theta, X, y, cfg)


def test_bad_state_raises():
    X, y, model, theta, cfg, state = _kron_state("categorical")
    with pytest.raises(ValueError, match=r"state\.kron: expected a non-empty tuple of KronBlock"):
        laplace.dense_precision(state._replace(kron=[tuple(b) for b in state.kron]))
    with pytest.raises(ValueError, match=r"state\.kron: expected blocks of"):
        laplace.dense_precision(state._replace(kron=state.kron[:1]))
    with pytest.raises(ValueError, match=r"state\.n_fixed: expected an int"):
        laplace.dense_precision(state._replace(n_fixed=model.D))
    with pytest.raises(ValueError, match=r"cfg\.subset: expected the state's subset"):
        laplace.log_marginal_likelihood(model, state, X, y, cfg._replace(subset="last_layer"))
    with pytest.raises(ValueError, match=r"eps: expected shape \(31, \*\)"):
        laplace.sample(state, np.ones((30, 2)))


def test_model_helpers_reject_bad_input():
    X, y, model, theta = _mlp("categorical")
    with pytest.raises(ValueError, match=r"curvature: expected 'ggn' or 'ef', got 'hessian'"):
        model.kfac_curvature(theta, X, y, "hessian")
    with pytest.raises(ValueError, match=r"X: expected shape"):
        model.last_layer(theta, X[:, :2])


# ----------------------------------------------------------------------------- evidence tools

def test_kron_prior_swap_and_covariance_diagonal():
    """(laplace.10) for kron: a new per-layer delta equals a refit; (laplace.11)'s diag(Sigma)
    equals the dense covariance's diagonal."""
    X, y, model, theta, cfg, state = _kron_state("categorical")
    new = _layer_delta(model, [3.0, 0.25])
    swapped = laplace._with_prior_precision(state, new)
    refit = laplace.fit(model, theta, X, y, cfg._replace(prior_precision=new))
    assert_close(laplace.dense_precision(swapped), laplace.dense_precision(refit), EXACT_F64,
                 "precision")
    assert_close(laplace._diag_covariance(state), np.diag(laplace.dense_covariance(state)),
                 EXACT_F64, "diag(Sigma)")


def test_kron_layerwise_prior_optimum_is_stationary():
    """'layerwise' on a kron state is one delta per layer block; at the L-BFGS optimum the
    evidence of a refit there has zero gradient (finite differences of the package's own
    log_marginal_likelihood), and 'diag' is refused."""
    X, y, model, theta, cfg, state = _kron_state("categorical")
    opt, info = laplace.optimize_prior_precision(model, state, X, y, cfg,
                                                 prior_structure="layerwise")
    assert info.converged
    delta = opt.prior_prec
    refit = laplace.fit(model, theta, X, y, cfg._replace(prior_precision=delta))
    assert_close(laplace.dense_precision(opt), laplace.dense_precision(refit), EXACT_F64, "state")
    lml = laplace.log_marginal_likelihood(model, refit, X, y, cfg._replace(prior_precision=delta))
    assert abs(lml - info.log_marglik) <= EXACT_F64 * abs(lml)
    h = 1e-5
    for l, (start, size) in enumerate([(0, 16), (16, 15)]):
        steps = []
        for sgn in (1.0, -1.0):
            d = delta.copy()
            d[start:start + size] *= np.exp(sgn * h)
            c = cfg._replace(prior_precision=d)
            steps.append(laplace.log_marginal_likelihood(model, laplace.fit(model, theta, X, y, c),
                                                         X, y, c))
        fd = (steps[0] - steps[1]) / (2 * h)
        assert abs(fd) < 1e-6, (l, fd)  # central difference error ~h^2 |f'''| << 1e-6
    with pytest.raises(ValueError, match=r"prior_structure: expected 'scalar' or 'layerwise'"):
        laplace.optimize_prior_precision(model, state, X, y, cfg, prior_structure="diag")


def test_curvature_is_what_fit_adds_the_prior_to():
    """laplace.curvature returns H of (laplace.2) / (laplace.18) / (laplace.23): the GGN, its
    last-layer block, and the K-FAC blocks, so that fit's precision is H + delta."""
    X, y, model, theta = _mlp("categorical")
    G = model.ggn(theta, X, y)
    full = laplace.curvature(model, theta, X, y, laplace.LaplaceConfig(1.0, "full", "ggn"))
    assert_close(full, G, EXACT_F64, "full")
    ll = laplace.curvature(model, theta, X, y,
                           laplace.LaplaceConfig(1.0, "diag", "ggn", "last_layer"))
    assert_close(ll, np.diag(G)[16:], EXACT_F64, "last-layer diagonal")
    blocks = laplace.curvature(model, theta, X, y, laplace.LaplaceConfig(1.0, "kron", "ggn"))
    for (A, B), (A_m, B_m) in zip(blocks, model.kfac_curvature(theta, X, y, "ggn")):
        assert np.array_equal(A, A_m) and np.array_equal(B, B_m)
    with pytest.raises(ValueError, match=r"cfg\.curvature: structure 'kron'"):
        laplace.curvature(model, theta, X, y,
                          laplace.LaplaceConfig(1.0, "kron")._replace(curvature="hessian"))



def test_kron_covariance_diagonal_from_the_eigenbasis():
    """(laplace.25): diag(Sigma) of a K-FAC state from each block's eigenbasis equals the dense
    covariance's diagonal (an MLP with per-layer prior precisions), and the row sums of squares
    of the symmetric square root R (R R^T = Sigma), the route it replaces. The CNN case, blocks
    in the permuted W~ order: test_laplace_cnn.py::test_kron_covariance_diagonal_through_the_perm."""
    _, _, _, _, _, state = _kron_state("categorical")
    got = laplace._diag_covariance(state)  # checks (laplace.25)
    assert_close(got, np.diag(laplace.dense_covariance(state)), EXACT_F64, "diag(Sigma)")
    R = laplace._sqrt_cov_times(state, np.eye(got.shape[0]))
    assert_close(got, np.sum(R * R, axis=1), EXACT_F64, "rows of R R^T")
