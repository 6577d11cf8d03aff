"""The Laplace approximation (refbayes.methods.laplace) on a CNN, subset "all": the "full" and
"diag" precisions against the model's dense GGN plus the prior, the "kron" precision against
``kfac_curvature``'s Kronecker blocks placed densely through ``kfac_layout`` (conv.24), its
draws against the dense symmetric root, the evidence and the GLM / MC predictives against dense
computations, and the last-layer split of a CNN ending in a Dense. derivations/conv.md (conv.33)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from refbayes.methods import laplace
from refbayes.models.conv import CNN, Activation, Conv2d, Dense, Flatten, tiny_cnn
from tests.tolerances import EXACT_F64, rel_err

STRUCTURES = ("full", "diag", "kron")
DELTA = 1.5


def _strided_cnn(likelihood="categorical"):
    """Padding 1, stride 2 on a 7x7 input (-> 2x4x4), tanh, then a dense head."""
    return CNN((1, 7, 7), [Conv2d(1, 2, 3, stride=2, padding=1), Activation("tanh"), Flatten(),
                           Dense(32, 3)], likelihood)


MODELS = {"tiny": tiny_cnn, "strided": _strided_cnn}


def _problem(name, likelihood="categorical", seed=0, N=7):
    model = MODELS[name](likelihood)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, model.n_in))
    y = rng.standard_normal((N, 3)) if likelihood == "gaussian" else rng.integers(0, 3, N)
    return model, X, y, model.init_theta(rng)


def _fit(model, theta, X, y, structure, curvature="ggn"):
    cfg = laplace.LaplaceConfig(DELTA, structure, curvature)
    return laplace.fit(model, theta, X, y, cfg, check_stationary=False), cfg


def _dense_kron_precision(model, theta, X, y, curvature="ggn"):
    """blockdiag of A_l kron B_l + delta I in the W~ order, placed at theta[idx_l] (conv.24)."""
    P = np.zeros((model.D, model.D))
    for (A, B), idx in zip(model.kfac_curvature(theta, X, y, curvature), model.kfac_layout()):
        flat = idx.ravel()
        P[np.ix_(flat, flat)] = np.kron(A, B) + DELTA * np.eye(flat.size)
    return P


def _dense_precision(model, theta, X, y, structure, curvature="ggn"):
    if structure == "kron":
        return _dense_kron_precision(model, theta, X, y, curvature)
    if curvature == "ggn":
        H = model.ggn(theta, X, y)
    else:
        G = model.per_example_grads(theta, X, y)
        H = G.T @ G
    if structure == "diag":
        H = np.diag(np.diag(H))
    return H + DELTA * np.eye(model.D)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("structure", STRUCTURES)
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_precision_is_the_dense_curvature_plus_prior(name, structure, curvature):
    """(laplace.3), (laplace.18) through the block map (conv.33): full H + delta I, diag
    diag(H) + delta, kron the kfac_curvature blocks placed by kfac_layout."""
    model, X, y, theta = _problem(name)
    state, _ = _fit(model, theta, X, y, structure, curvature)
    P = _dense_precision(model, theta, X, y, structure, curvature)
    assert rel_err(laplace.dense_precision(state), P) < EXACT_F64
    assert rel_err(laplace.dense_covariance(state), np.linalg.inv(P)) < 1e-10
    if structure == "kron":
        assert state.kron_perm is not None  # the conv block is permuted


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("structure", STRUCTURES)
def test_sample_draws_are_the_printed_map(name, structure):
    """(laplace.4) / (laplace.20): full mu + L^{-T} eps, diag mu + eps / sqrt(prec_diag), kron
    mu + Sigma^{1/2} eps with the symmetric root of the whole dense covariance (unique, so equal
    to the per-block roots in the permuted order)."""
    model, X, y, theta = _problem(name)
    state, _ = _fit(model, theta, X, y, structure)
    P = _dense_precision(model, theta, X, y, structure)
    eps = np.random.default_rng(4).standard_normal((model.D, 3))
    if structure == "full":
        step = np.linalg.inv(np.linalg.cholesky(P)).T @ eps
    elif structure == "diag":
        step = eps / np.sqrt(np.diag(P))[:, None]
    else:
        lam, Q = np.linalg.eigh(np.linalg.inv(P))
        step = ((Q * np.sqrt(lam)) @ Q.T) @ eps  # (laplace.20)
    assert rel_err(laplace.sample(state, eps), theta[:, None] + step) < 1e-10
    assert np.max(np.abs(step)) > 1e-2


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("structure", STRUCTURES)
def test_evidence_is_the_dense_formula(name, structure):
    """(laplace.5): -sum_i l_i(mu) + log N(mu; 0, I / delta) + (D / 2) log 2 pi
    - (1 / 2) log det P, with P the dense precision."""
    model, X, y, theta = _problem(name)
    state, cfg = _fit(model, theta, X, y, structure)
    P = _dense_precision(model, theta, X, y, structure)
    D = model.D
    log_prior = 0.5 * D * math.log(DELTA / (2 * math.pi)) - 0.5 * DELTA * theta @ theta
    ref = -model.loss(theta, X, y) + log_prior + 0.5 * D * math.log(2 * math.pi) \
        - 0.5 * np.linalg.slogdet(P)[1]
    got = laplace.log_marginal_likelihood(model, state, X, y, cfg)
    assert abs(got - ref) <= EXACT_F64 * (1 + abs(ref))


@pytest.mark.parametrize("structure", STRUCTURES)
def test_predictives_are_the_dense_ones(structure):
    """(laplace.7), (laplace.21), (laplace.16): the GLM functional covariance J Sigma J^T
    (classifier and gaussian), and the MC predictive's f_samples at the state's draws."""
    model, X, y, theta = _problem("strided")
    state, _ = _fit(model, theta, X, y, structure)
    Sigma = np.linalg.inv(_dense_precision(model, theta, X, y, structure))
    Xs = np.random.default_rng(9).standard_normal((4, model.n_in))
    J = model.jacobian(theta, Xs)
    pred = laplace.glm_class_predictive(model, state, Xs)
    assert rel_err(pred.f_var, np.einsum("mkd,de,mle->mkl", J, Sigma, J)) < 1e-10
    eps = np.random.default_rng(5).standard_normal((model.D, 2))
    mc = laplace.mc_predictive(model, state, Xs, eps)
    draws = laplace.sample(state, eps)
    assert rel_err(mc.f_samples, np.stack([model.forward(draws[:, s], Xs) for s in range(2)])) \
        < EXACT_F64
    gmodel, gX, gy, gtheta = _problem("tiny", "gaussian")
    gstate, _ = _fit(gmodel, gtheta, gX, gy, structure)
    gSigma = np.linalg.inv(_dense_precision(gmodel, gtheta, gX, gy, structure))
    gJ = gmodel.jacobian(gtheta, gX[:3])
    glm = laplace.glm_predictive(gmodel, gstate, gX[:3])
    assert rel_err(glm.f_var, np.einsum("mkd,de,mle->mkl", gJ, gSigma, gJ)) < 1e-10
    assert rel_err(glm.y_var - glm.f_var, np.broadcast_to(np.eye(3), (3, 3, 3))) < EXACT_F64


def test_layerwise_prior_follows_the_tensors():
    """expand_prior_precision repeats one value per torch tensor (conv weight, conv bias, dense
    weight, dense bias); a kron state with a foreign kron_perm is refused."""
    model, X, y, theta = _problem("tiny")
    delta = laplace.expand_prior_precision(model, np.array([1.0, 2.0, 3.0, 4.0]))
    assert np.array_equal(delta, np.repeat([1.0, 2.0, 3.0, 4.0], [18, 2, 24, 3]))
    bad = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(DELTA, "kron"),
                      check_stationary=False)
    with pytest.raises(ValueError, match="kron_perm"):
        laplace.sample(bad._replace(kron_perm=np.arange(model.D)[::-1].copy()),
                       np.zeros((model.D, 1)))


@pytest.mark.parametrize("curvature", ["ggn", "ef", "hessian"])
@pytest.mark.parametrize("likelihood", ["categorical", "gaussian"])
def test_last_layer_on_a_cnn_is_the_networks_block(likelihood, curvature):
    """(laplace.23) on a CNN: the head's curvature on the features phi (the input of the final
    Dense) is the exact last-layer block of the whole CNN's GGN / EF / Hessian; the sampler
    moves only those entries, with covariance the block's inverse; the GLM predictive uses the
    last Jacobian columns; kron is the head's K-FAC."""
    # checks (peg.15)
    model, X, y, theta = _problem("tiny", likelihood)
    head, phi = model.last_layer(theta, X)
    off = model.D - head.D
    assert (head.sizes, off) == ((8, model.n_out), model.D - 9 * model.n_out)
    G = model.per_example_grads(theta, X, y)
    H = {"ggn": lambda: model.ggn(theta, X, y), "ef": lambda: G.T @ G,
         "hessian": lambda: model.hessian(theta, X, y)}[curvature]()
    delta = np.linspace(0.5, 1.5, head.D)
    state = laplace.fit(model, theta, X, y,
                        laplace.LaplaceConfig(delta, "full", curvature, "last_layer"),
                        check_stationary=False)
    assert state.n_fixed == off
    _close(laplace.dense_precision(state), H[off:, off:] + np.diag(delta), "precision")
    Th = laplace.sample(state, np.eye(head.D))
    assert np.all(Th[:off] == theta[:off, None])
    R = Th[off:] - theta[off:, None]
    Sigma = np.linalg.inv(laplace.dense_precision(state))
    _close(R @ R.T, Sigma, "R R^T")
    X_star = np.random.default_rng(5).standard_normal((3, model.n_in))  # rows, as X
    J = model.jacobian(theta, X_star)[:, :, off:]
    pred = (laplace.glm_predictive if likelihood == "gaussian"
            else laplace.glm_class_predictive)(model, state, X_star)
    _close(pred.f_var, np.einsum("mkd,de,mle->mkl", J, Sigma, J), "f_var")
    if curvature != "hessian":
        kr = laplace.fit(model, theta, X, y,
                         laplace.LaplaceConfig(2.0, "kron", curvature, "last_layer"),
                         check_stationary=False)
        (A, B), = head.kfac_curvature(theta[off:], phi, y, curvature)
        _close(laplace.dense_precision(kr), np.kron(A, B) + 2.0 * np.eye(head.D), "kron")


def _close(a, b, what):
    err = rel_err(a, b)
    assert err <= EXACT_F64, f"{what}: relative error {err:.3e}"


def test_last_layer_needs_a_final_dense():
    conv_last = CNN((1, 4, 4), [Conv2d(1, 2, (3, 3)), Activation("relu"), Flatten(),
                                Dense(8, 3), Activation("tanh")], likelihood="gaussian")
    rng = np.random.default_rng(0)
    theta, X = conv_last.init_theta(rng), rng.standard_normal((2, 1, 4, 4))
    with pytest.raises(ValueError, match="not a Dense"):
        conv_last.last_layer(theta, X)


@pytest.mark.parametrize("name", MODELS)
def test_kron_covariance_diagonal_through_the_perm(name):
    """(laplace.25) on a CNN: the blocks' diagonals, computed in the W~ order of (conv.33) and
    scattered back through kron_perm, equal the dense covariance's diagonal in theta's order."""
    model, X, y, theta = _problem(name)
    state, _ = _fit(model, theta, X, y, "kron")
    assert state.kron_perm is not None
    got = laplace._diag_covariance(state)  # checks (laplace.25)
    want = np.diag(np.linalg.inv(_dense_kron_precision(model, theta, X, y)))
    assert rel_err(got, want) <= EXACT_F64
