"""refbayes.models.conv K-FAC (third slice): the expand and reduce factors of conv layers, their
layout, their exact cases and the block errors, against plain loops and dense GGN blocks.

Equations: derivations/conv.md (conv.24)-(conv.32). Oracles: ``kfac_loop`` of
tests/reference/conv_loops.py (patches read entry by entry, output errors by autograd, one example
and one position at a time), the dense GGN ``ggn_loop`` and G^T G of ``per_example_grads_loop``
(autograd of the plain-loop network), and the MLP's K-FAC for dense-only nets. float64, EXACT_F64.
"""
import numpy as np
import pytest

import refbayes.models.conv as conv_module
from refbayes.backend import to_numpy
from refbayes.models import MLP
from refbayes.models.conv import (
    CNN,
    KFAC_APPROX,
    Activation,
    AvgPool2d,
    Conv2d,
    Dense,
    Flatten,
    MaxPool2d,
    tiny_cnn,
)
from tests.reference import conv_loops as ref
from tests.tolerances import EXACT_F64, assert_close


def _avgpool_net(likelihood="categorical", n_out=3):
    """A strided, padded conv, an overlapping strided average pool, tanh and a no-bias conv."""
    return CNN((2, 7, 6), [
        Conv2d(2, 3, 3, stride=2, padding=1), Activation("tanh"),
        AvgPool2d(2, stride=1),
        Conv2d(3, 2, (2, 1), padding=(0, 1), bias=False), Activation("relu"),
        MaxPool2d(2, stride=1), Flatten(), Dense(2 * 1 * 3, n_out)], likelihood)


MODELS = {
    "tiny-categorical": tiny_cnn(),
    "tiny-gaussian": tiny_cnn("gaussian", n_out=2, noise_precision=2.5),
    "tiny-bernoulli": tiny_cnn("bernoulli", n_out=1),
    "avgpool-categorical": _avgpool_net(),
    "avgpool-gaussian": _avgpool_net("gaussian", 2),
}


def _targets(model, rng, M):
    K, lik = model.n_out, model.likelihood.name
    if lik == "gaussian":
        return rng.normal(size=(M, K))
    return rng.integers(0, 2 if lik == "bernoulli" else K, size=M)


def _batch(model, M=3, seed=0):
    rng = np.random.default_rng(seed)
    theta = model.init_theta(rng, scheme="pytorch")
    X = rng.normal(size=(M,) + model.input_shape)
    return theta, X, _targets(model, rng, M)


def _exact_block(model, theta, X, y, curvature):
    """The dense curvature (D, D) from the plain-loop network: GGN, or G^T G for "ef"."""
    spec = ref.LoopSpec(model)
    if curvature == "ggn":
        return ref.ggn_loop(spec, theta, X, y)
    G = ref.per_example_grads_loop(spec, theta, X, y)
    return G.T @ G


def _blocks(model, dense):
    """Each parameter layer's block of ``dense`` in the order of vec_row_major(W~) (conv.24)."""
    return [dense[np.ix_(idx.ravel(), idx.ravel())] for idx in model.kfac_layout()]


@pytest.mark.parametrize("curvature", ["ggn", "ef"])
@pytest.mark.parametrize("approx", KFAC_APPROX)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_factors_match_the_loop_reference(name, approx, curvature):
    # checks (conv.26), (conv.27), (conv.29): A and B of every layer (conv with and without bias,
    # strided, padded; dense) against the definitions evaluated one example and position at a time
    model = MODELS[name]
    theta, X, y = _batch(model)
    spec = ref.LoopSpec(model)
    factors = model.kfac_curvature(theta, X.reshape(len(X), -1), y, curvature, approx)
    assert len(factors) == len(model.kfac_layout())
    for j, (A, B) in enumerate(factors):
        A_ref, B_ref = ref.kfac_loop(spec, theta, X, y, j, approx, curvature)
        assert A.shape == A_ref.shape and B.shape == B_ref.shape
        assert_close(A, A_ref, EXACT_F64, f"{name} {approx} {curvature} A[{j}]")
        assert_close(B, B_ref, EXACT_F64, f"{name} {approx} {curvature} B[{j}]")


def test_layout_maps_theta_to_w_tilde():
    # checks (conv.24): theta[idx] = [Wm^T; b^T] for a conv layer, [W; b^T] for a dense one, and
    # the index arrays cover theta once
    model = _avgpool_net()
    theta = np.arange(model.D, dtype=np.float64)
    idx = model.kfac_layout()
    assert np.array_equal(np.sort(np.concatenate([i.ravel() for i in idx])), np.arange(model.D))
    for (W, b), layer, ix in zip(model.unflatten(theta), [l for l in model.layers
                                                           if isinstance(l, (Conv2d, Dense))], idx):
        Wt = theta[ix]
        if isinstance(layer, Conv2d):
            Wm = W.reshape(layer.c_out, -1)
            expect = Wm.T if b is None else np.vstack([Wm.T, b[None, :]])
        else:
            expect = W if b is None else np.vstack([W, b[None, :]])
        assert np.array_equal(Wt, expect)


def test_factors_ingredients_give_the_per_example_gradients():
    # checks (conv.25): dl_i/dW~ = U~_i Delta_i^T from kfac_factors' U and Delta, laid out by
    # kfac_layout, is the per-example gradient row
    model = _avgpool_net()
    theta, X, y = _batch(model)
    rows = model.per_example_grads(theta, X, y)
    for (a, g), idx, layer in zip(model.kfac_factors(theta, X, y), model.kfac_layout(),
                                  [l for l in model.layers if isinstance(l, (Conv2d, Dense))]):
        if a.ndim == 2:
            a, g = a[:, :, None], g[:, :, None]
        if layer.bias:
            a = np.concatenate([a, np.ones((a.shape[0], 1, a.shape[2]))], axis=1)
        G = a @ np.swapaxes(g, 1, 2)  # (M, n_a, n_b)
        assert_close(G.reshape(len(X), -1), rows[:, idx.ravel()], EXACT_F64, "U~ Delta^T")


def _exact_cases():
    """(name, model, M, the approximations exact for its first layer) of (conv.30)."""
    return [
        # (i) one example, one output position (window = padded input), nonlinear layers after
        ("one-position", CNN((2, 3, 3), [Conv2d(2, 4, 3), Activation("tanh"), Flatten(),
                                        Dense(4, 3)]), 1, ("expand", "reduce")),
        ("one-position-padded", CNN((1, 2, 3), [Conv2d(1, 3, (4, 3), padding=(1, 0)),
                                                Activation("tanh"), Flatten(), Dense(3, 1)],
                                    "bernoulli"), 1, ("expand", "reduce")),
        # (ii) the conv output is the network output (Flatten only), gaussian: expand
        ("expand-setting", CNN((2, 5, 4), [Conv2d(2, 3, (3, 2), stride=(2, 1), padding=1),
                                          Flatten()], "gaussian", noise_precision=2.5),
         4, ("expand",)),
        # (iii) a global average pool after the conv, gaussian: reduce
        ("reduce-setting", CNN((2, 5, 4), [Conv2d(2, 3, (3, 2), stride=(2, 1), padding=1),
                                          AvgPool2d((3, 5)), Flatten()], "gaussian",
                               noise_precision=2.5), 4, ("reduce",)),
    ]


@pytest.mark.parametrize("case", _exact_cases(), ids=lambda c: c[0])
def test_kronecker_product_is_the_exact_block_where_kfac_is_exact(case):
    # checks (conv.30), (conv.24), (conv.25): A kron B = the exact GGN block (and the EF block in
    # case (i)) of the first conv layer, permuted by kfac_layout; the other approximation is not
    name, model, M, exact = case
    theta, X, y = _batch(model, M=M, seed=1)
    curvatures = ("ggn", "ef") if M == 1 else ("ggn",)
    for curvature in curvatures:
        Y = _blocks(model, _exact_block(model, theta, X, y, curvature))[0]
        for approx in KFAC_APPROX:
            A, B = model.kfac_curvature(theta, X, y, curvature, approx)[0]
            err = model.kfac_block_errors(theta, X, y, curvature, approx)["rel_err"][0]
            if approx in exact:
                assert_close(np.kron(A, B), Y, EXACT_F64, f"{name} {approx} {curvature}")
                assert err <= EXACT_F64
            else:  # P > 1 here: the other variant misses the cross-position terms
                assert np.linalg.norm(np.kron(A, B) - Y) > 0.1 * np.linalg.norm(Y)
                assert err > 0.1


@pytest.mark.parametrize("approx", KFAC_APPROX)
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
@pytest.mark.parametrize("name", ["tiny-categorical", "avgpool-gaussian"])
@pytest.mark.parametrize("route", ["matrix", "gram"])
def test_block_errors_match_the_dense_blocks(name, curvature, approx, route, monkeypatch):
    # checks (conv.31): ||A kron B - Y|| / ||Y|| against the dense blocks of the plain-loop GGN
    # (or EF), on both routes (the n x n difference; the Grams, forced by a zero size limit); a
    # general conv net is not exact for either variant
    if route == "gram":
        monkeypatch.setattr(conv_module, "_DENSE_BLOCK_LIMIT", 0)
    model = MODELS[name]
    theta, X, y = _batch(model, M=3, seed=2)
    Ys = _blocks(model, _exact_block(model, theta, X, y, curvature))
    factors = model.kfac_curvature(theta, X, y, curvature, approx)
    out = model.kfac_block_errors(theta, X, y, curvature, approx)
    rel = [np.linalg.norm(np.kron(A, B) - Y) / np.linalg.norm(Y) for (A, B), Y in zip(factors, Ys)]
    assert_close(out["rel_err"], np.array(rel), EXACT_F64, f"{name} rel_err")
    assert_close(out["exact_norm"], np.array([np.linalg.norm(Y) for Y in Ys]), EXACT_F64, "||Y||")
    assert_close(out["kfac_norm"], np.array([np.linalg.norm(np.kron(A, B)) for A, B in factors]),
                 EXACT_F64, "||A kron B||")
    assert out["rel_err"][0] > 1e-3  # the first conv layer: cross-position terms are dropped


@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_dense_only_cnn_is_the_mlp(curvature):
    # checks (conv.29): with P = 1 both variants are the MLP's (peg.13), factors and errors
    mlp = MLP([5, 4, 3], activation="tanh", likelihood="categorical")
    cnn = CNN((5, 1, 1), [Flatten(), Dense(5, 4), Activation("tanh"), Dense(4, 3)])
    rng = np.random.default_rng(3)
    theta = mlp.init_theta(rng)
    X = rng.normal(size=(4, 5))
    y = rng.integers(0, 3, size=4)
    ref_f = mlp.kfac_curvature(theta, X, y, curvature)
    ref_e = mlp.kfac_block_errors(theta, X, y, curvature)["rel_err"]
    for approx in KFAC_APPROX:
        for (A, B), (Ar, Br) in zip(cnn.kfac_curvature(theta, X, y, curvature, approx), ref_f):
            assert_close(A, Ar, EXACT_F64, "A")
            assert_close(B, Br, EXACT_F64, "B")
        assert_close(cnn.kfac_block_errors(theta, X, y, curvature, approx)["rel_err"], ref_e,
                     EXACT_F64, "rel_err")


@pytest.mark.parametrize("approx", KFAC_APPROX)
def test_moments_average_the_single_vector_factors(approx):
    # checks (conv.32): gradients and factors at S vectors = S single calls averaged, with the
    # per-vector weights c_s (B times c_s^2 for "ef", c_s for "ggn") and sampled labels y_curv
    model = _avgpool_net()
    rng = np.random.default_rng(4)
    thetas = np.stack([model.init_theta(rng, scheme="pytorch") for _ in range(3)])
    X = rng.normal(size=(2,) + model.input_shape)
    y = _targets(model, rng, 2)
    y_curv = np.stack([_targets(model, rng, 2) for _ in range(3)])
    c = np.array([0.5, 1.0, 2.0])
    for curvature, yc in (("ggn", None), ("ef", None), ("ef", y_curv)):
        g, factors = model.kfac_moments(thetas, X, y, curvature, yc, c, approx=approx)
        assert_close(g, np.stack([model.grad(t, X, y) * cs for t, cs in zip(thetas, c)]),
                     EXACT_F64, "g")
        power = 2 if curvature == "ef" else 1
        singles = [model.kfac_curvature(t, X, y if yc is None else yc[s], curvature, approx)
                   for s, t in enumerate(thetas)]
        for j, (A, B) in enumerate(factors):
            assert_close(A, sum(f[j][0] for f in singles) / 3, EXACT_F64, "A")
            assert_close(B, sum(f[j][1] * cs ** power for f, cs in zip(singles, c)) / 3,
                         EXACT_F64, "B")
    g, none = model.kfac_moments(thetas, X, y)
    assert none is None and g.shape == (3, model.D)


def test_bad_arguments():
    model = tiny_cnn()
    theta, X, y = _batch(model)
    with pytest.raises(ValueError, match="approx"):
        model.kfac_curvature(theta, X, y, "ggn", "kfc")
    with pytest.raises(ValueError, match="curvature"):
        model.kfac_curvature(theta, X, y, "mc")
    with pytest.raises(ValueError, match="approx"):
        model.kfac_block_errors(theta, X, y, approx="sum")
    with pytest.raises(ValueError, match="y_curv"):
        model.kfac_moments(theta[None], X, y, "ggn", y_curv=y[None])
    with pytest.raises(ValueError, match="scale"):
        model.kfac_moments(theta[None], X, y, "ggn", scale=np.array([-1.0]))
    with pytest.raises(ValueError, match="X"):
        model.kfac_curvature(theta, X[:, :, :5], y)


@pytest.mark.parametrize("route", ["matrix", "gram"])
def test_backend_results_stay_on_the_inputs_backend(xp, route, monkeypatch):
    # checks (conv.26), (conv.27), (conv.31), (conv.32) on the xp backend (CuPy where present)
    # against NumPy
    if route == "gram":
        monkeypatch.setattr(conv_module, "_DENSE_BLOCK_LIMIT", 0)
    model = MODELS["avgpool-categorical"]
    theta, X, y = _batch(model, M=3, seed=5)
    args = [xp.asarray(a) for a in (theta, X, y)]
    for approx in KFAC_APPROX:
        for (A, B), (An, Bn) in zip(model.kfac_curvature(*args, "ggn", approx),
                                    model.kfac_curvature(theta, X, y, "ggn", approx)):
            assert isinstance(A, xp.ndarray) and isinstance(B, xp.ndarray)
            assert_close(to_numpy(A), An, EXACT_F64, "A on xp")
            assert_close(to_numpy(B), Bn, EXACT_F64, "B on xp")
        e, en = (model.kfac_block_errors(*args, "ef", approx),
                 model.kfac_block_errors(theta, X, y, "ef", approx))
        assert all(isinstance(v, xp.ndarray) for v in e.values())
        assert_close(to_numpy(e["rel_err"]), en["rel_err"], EXACT_F64, "rel_err on xp")
        g, f = model.kfac_moments(args[0][None], args[1], args[2], "ggn", approx=approx)
        gn, fn = model.kfac_moments(theta[None], X, y, "ggn", approx=approx)
        assert isinstance(g, xp.ndarray)
        assert_close(to_numpy(g), gn, EXACT_F64, "g on xp")
        assert_close(to_numpy(f[0][1]), fn[0][1], EXACT_F64, "moments B on xp")
