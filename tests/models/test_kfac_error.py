"""K-FAC's relative Frobenius error per layer (FlatModel.kfac_block_errors, (peg.16)).

Oracle: the dense blocks themselves. K-FAC's block is np.kron of the factors ``kfac_curvature``
returns; the exact block is the layer's diagonal block of ``model.ggn`` ("ggn") or of G^T G with
G = ``per_example_grads`` ("ef"); e_l = ||X_l - Y_l||_F / ||Y_l||_F formed explicitly. The
parameter ordering behind "layer block = sum_i P_i kron B_i" is checked on its own (EF rows
rebuilt from ``kfac_factors``). Small errors are checked against exact rational arithmetic on the
float64 factors, where the expanded ||X||^2 - 2 <X, Y> + ||Y||^2 loses every digit.
"""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refbayes.models import MLP, LogisticRegression, SoftmaxRegression
from refbayes.models.base import FlatModel
from refbayes.models.likelihoods import make_likelihood
from tests.models.cases import Case, batch
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

CURVATURES = ["ggn", "ef"]
KEYS = ("rel_err", "kfac_norm", "exact_norm")

# Several layers, tanh and relu, categorical (C = 3, 4), bernoulli and gaussian likelihoods, with
# a bias in every layer (MLP) and without one (linear models without intercept; a FlatModel with
# hidden layers and bias=False).
CASES = [
    Case("mlp-tanh-categorical3-2h", MLP([4, 5, 6, 3], "tanh", "categorical"), M=7),
    Case("mlp-relu-categorical4-2h", MLP([3, 6, 5, 4], "relu", "categorical"), M=9),
    Case("mlp-tanh-bernoulli-2h", MLP([4, 6, 5, 1], "tanh", "bernoulli"), M=8),
    Case("mlp-relu-bernoulli-1h", MLP([3, 7, 1], "relu", "bernoulli"), M=6),
    Case("mlp-relu-gaussian2out-2h", MLP([3, 5, 4, 2], "relu", "gaussian", noise_precision=2.5), M=7),
    Case("mlp-tanh-gaussian-3h", MLP([2, 4, 4, 3, 1], "tanh", "gaussian", noise_precision=0.7), M=5),
    Case("nobias-tanh-categorical-1h", FlatModel((4, 5, 3), "tanh", make_likelihood("categorical"),
                                                 bias=False), M=6),
    Case("logistic-intercept", LogisticRegression(4), M=6),
    Case("logistic-nointercept", LogisticRegression(4, intercept=False), M=6),
    Case("softmax-intercept", SoftmaxRegression(4, 3), M=6),
    Case("softmax-nointercept", SoftmaxRegression(3, 4, intercept=False), M=6),
]
IDS = [c.id for c in CASES]


def _layer_slices(model):
    """theta slices of the layers' [W_l row-major, b_l] blocks, in layer order."""
    out, off = [], 0
    for n_in, n_out in zip(model.sizes[:-1], model.sizes[1:]):
        size = (n_in + model.bias) * n_out
        out.append(slice(off, off + size))
        off += size
    assert off == model.D
    return out


def _exact_curvature(model, theta, X, y, curvature):
    if curvature == "ggn":
        return model.ggn(theta, X, y)
    G = model.per_example_grads(theta, X, y, impl="autograd")
    return G.T @ G


def dense_errors(model, theta, X, y, curvature):
    """{key: (L,)} from the dense blocks: np.kron(A_l, B_l) against the exact layer block."""
    theta, X = (np.asarray(a, dtype=np.float64) for a in (theta, X))
    H = _exact_curvature(model, theta, X, y, curvature)
    out = {k: [] for k in KEYS}
    for (A, B), sl in zip(model.kfac_curvature(theta, X, y, curvature), _layer_slices(model)):
        K, Y = np.kron(A, B), H[sl, sl]
        with np.errstate(divide="ignore", invalid="ignore"):  # Y = 0: see test_zero_exact_block
            out["rel_err"].append(np.linalg.norm(K - Y) / np.linalg.norm(Y))
        out["kfac_norm"].append(np.linalg.norm(K))
        out["exact_norm"].append(np.linalg.norm(Y))
    return {k: np.array(v) for k, v in out.items()}


def _check(got, want, tol, what):
    """The norms relative to their scale; e_l, itself a fraction of ||Y_l||, on the scale
    max(1, max e): the dense reference's e_l carries an absolute rounding error ~eps (for M = 1
    it is ~1e-16 where the exact and the computed value are 0)."""
    assert set(got) == set(KEYS)
    for k in ("kfac_norm", "exact_norm"):
        assert_close(got[k], want[k], tol, f"{what} {k}")
    g, w = np.asarray(got["rel_err"], dtype=np.float64), want["rel_err"]
    err = np.max(np.abs(g - w), initial=0.0) / max(1.0, np.max(w, initial=0.0))
    assert err <= tol, f"{what} rel_err: error {err:.3e} > tolerance {tol:.1e} ({g} vs {w})"


# ----------------------------------------------------------------------------- against the dense blocks

@pytest.mark.parametrize("curvature", CURVATURES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_matches_the_dense_blocks(case, curvature, xp):
    # checks (peg.16)
    theta, X, y = batch(case, np.float64, xp)
    got = case.model.kfac_block_errors(theta, X, y, curvature)
    for k in KEYS:
        assert got[k].shape == (case.model.n_layers,) and got[k].dtype == np.float64
        assert type(got[k]) is type(theta)  # on the inputs' backend
    got = {k: np.asarray(v.get() if hasattr(v, "get") else v) for k, v in got.items()}
    want = dense_errors(case.model, *batch(case), curvature)
    _check(got, want, EXACT_F64, f"{case.id} {curvature}")
    # the errors are real (not all zero), or the comparison could not fail
    assert want["rel_err"].max() > 1e-2


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_ef_block_is_sum_of_kron_products_in_theta_order(case):
    """The parameter ordering (peg.13) relies on: the layer block of G^T G is
    sum_i (a~_i a~_i^T) kron (g_i g_i^T) with a~_i = [a_i, 1] ([W_l; b_l^T] row-major)."""
    theta, X, y = batch(case)
    G = case.model.per_example_grads(theta, X, y, impl="autograd")
    for (a, g), sl in zip(case.model.kfac_factors(theta, X, y), _layer_slices(case.model)):
        if case.model.bias:
            a = np.concatenate([a, np.ones((a.shape[0], 1))], axis=1)
        blocks = sum(np.kron(np.outer(ai, ai), np.outer(gi, gi)) for ai, gi in zip(a, g))
        assert_close(blocks, G[:, sl].T @ G[:, sl], EXACT_F64, f"{case.id} layer block")


@pytest.mark.parametrize("curvature", CURVATURES)
def test_float32_within_the_stated_tolerance(curvature):
    """float32 in, float32 out; the float32 contract EXACT_F32 (1e-3 relative) against float64."""
    for case in CASES:
        theta, X, y = batch(case, np.float32)
        got = case.model.kfac_block_errors(theta, X, y, curvature)
        assert all(got[k].dtype == np.float32 for k in KEYS)
        _check(got, dense_errors(case.model, *batch(case), curvature), EXACT_F32,
               f"{case.id} {curvature} float32")


@st.composite
def networks(draw):
    """An MLP (1-3 hidden layers of 1-6 units, tanh or relu, any likelihood) and its batch."""
    likelihood = draw(st.sampled_from(["categorical", "bernoulli", "gaussian"]))
    K = {"categorical": draw(st.integers(3, 5)), "bernoulli": 1,
         "gaussian": draw(st.integers(1, 3))}[likelihood]
    hidden = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    sizes = [draw(st.integers(1, 5))] + hidden + [K]
    model = MLP(sizes, draw(st.sampled_from(["tanh", "relu"])), likelihood,
                noise_precision=draw(st.floats(0.1, 10.0)))
    return Case("hypothesis", model, M=draw(st.integers(1, 12))), draw(st.integers(0, 2**31))


@given(networks(), st.sampled_from(CURVATURES))
def test_random_networks_match_the_dense_blocks(drawn, curvature):
    case, seed = drawn
    theta, X, y = batch(case, seed=seed)
    got = case.model.kfac_block_errors(theta, X, y, curvature)
    want = dense_errors(case.model, theta, X, y, curvature)
    # where the exact block is 0 (dead relu units, y == f), 0 / 0 is reported as 0
    zero = want["exact_norm"] == 0
    want["rel_err"][zero] = np.where(want["kfac_norm"][zero] == 0, 0.0, np.inf)
    assert np.array_equal(np.isinf(got["rel_err"]), np.isinf(want["rel_err"]))
    finite = ~np.isinf(want["rel_err"])
    got["rel_err"], want["rel_err"] = got["rel_err"][finite], want["rel_err"][finite]
    _check(got, want, EXACT_F64, f"{case.model!r} M={case.M} {curvature}")


@pytest.mark.slow
def test_large_batch_goes_through_the_chunked_grams():
    """The hidden layer (n = 5 > R^2 = 4) takes the R x R route, and M R^2 M > 2^22 there: its
    Gram products are taken over two chunks of rows. (The categorical cases above take the
    n x n route, n <= R^2; the relu-gaussian2out case has one layer of each.)"""
    case = Case("wide-gaussian", MLP([3, 5, 2], "tanh", "gaussian", noise_precision=2.0), M=1100)
    theta, X, y = batch(case)
    _check(case.model.kfac_block_errors(theta, X, y, "ggn"),
           dense_errors(case.model, theta, X, y, "ggn"), EXACT_F64, "chunked")


# ----------------------------------------------------------------------------- where K-FAC is exact

@pytest.mark.parametrize("curvature", CURVATURES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_one_row_is_exactly_zero(case, curvature):
    """M = 1: the sum of products is one product, so e_l = 0, exactly (the shifted Grams are 0)."""
    theta, X, y = batch(case._replace(M=1))
    got = case.model.kfac_block_errors(theta, X, y, curvature)
    assert np.all(got["rel_err"] == 0.0), got["rel_err"]
    want = dense_errors(case.model, theta, X, y, curvature)
    assert want["rel_err"].max() <= EXACT_F64  # the dense blocks agree (to rounding)
    assert_close(got["exact_norm"], want["exact_norm"], EXACT_F64, "exact norm, M = 1")
    assert_close(got["kfac_norm"], got["exact_norm"], EXACT_F64, "both norms, M = 1")


@pytest.mark.parametrize("curvature", CURVATURES)
@pytest.mark.parametrize("model", [LogisticRegression(3), LogisticRegression(3, intercept=False),
                                   SoftmaxRegression(3, 4), SoftmaxRegression(4, 3, intercept=False)],
                         ids=["logistic", "logistic-nointercept", "softmax", "softmax-nointercept"])
def test_identical_rows_are_exactly_zero(model, curvature):
    """A linear model's layer input is X: identical rows give equal P_i, hence e = 0 exactly,
    even for "ef", where the B_i differ (the labels do)."""
    rng = np.random.default_rng(3)
    X = np.repeat(rng.standard_normal((1, model.sizes[0])), 6, axis=0)
    y = np.array([0, 1, 1, 0, 1, 0])
    theta = rng.standard_normal(model.D)
    got = model.kfac_block_errors(theta, X, y, curvature)
    assert got["rel_err"][0] == 0.0
    assert got["exact_norm"][0] > 0
    assert dense_errors(model, theta, X, y, curvature)["rel_err"][0] <= EXACT_F64


@pytest.mark.parametrize("curvature", CURVATURES)
def test_identical_rows_give_an_exact_zero_in_the_first_layer(curvature):
    case = CASES[1]
    theta, X, y = batch(case)
    X = np.repeat(X[:1], case.M, axis=0)
    got = case.model.kfac_block_errors(theta, X, y, curvature)
    assert got["rel_err"][0] == 0.0
    assert dense_errors(case.model, theta, X, y, curvature)["rel_err"][0] <= EXACT_F64


@pytest.mark.parametrize("case", [c for c in CASES if c.model.likelihood.name == "gaussian"],
                         ids=[c.id for c in CASES if c.model.likelihood.name == "gaussian"])
def test_gaussian_last_layer_is_exactly_zero_for_the_ggn(case):
    """B_i = tau I in the last layer (C_i = sqrt(tau) I): all equal, so e_L = 0 exactly, while
    the hidden layers' errors are not 0."""
    theta, X, y = batch(case)
    got = case.model.kfac_block_errors(theta, X, y, "ggn")
    assert got["rel_err"][-1] == 0.0
    want = dense_errors(case.model, theta, X, y, "ggn")
    assert want["rel_err"][-1] <= EXACT_F64
    assert want["rel_err"][0] > 1e-2 and got["rel_err"][0] > 1e-2


def test_zero_exact_block():
    """Y_l = 0: e_l = 0 when K-FAC's block is 0 too (every g_i = 0), inf when it is not (P_1 = 0
    and g_2 = 0, so Y_l = 0 but A_l kron B_l = P_2 kron g_1 g_1^T / 2 != 0)."""
    model = FlatModel((3, 2), "tanh", make_likelihood("gaussian"), bias=False)
    rng = np.random.default_rng(5)
    theta, X = rng.standard_normal(model.D), rng.standard_normal((2, 3))
    f = model.forward(theta, X)
    got = model.kfac_block_errors(theta, X, f, "ef")  # y = f: every g_i = 0
    assert got["rel_err"][0] == 0.0 and got["kfac_norm"][0] == 0.0 and got["exact_norm"][0] == 0.0
    X[0] = 0.0
    y = model.forward(theta, X) + np.array([[1.0, -2.0], [0.0, 0.0]])  # g_1 != 0, g_2 = 0
    got = model.kfac_block_errors(theta, X, y, "ef")
    want = dense_errors(model, theta, X, y, "ef")
    assert want["exact_norm"][0] == 0.0 and want["kfac_norm"][0] > 0
    assert got["rel_err"][0] == np.inf and got["exact_norm"][0] == 0.0
    assert_close(got["kfac_norm"], want["kfac_norm"], EXACT_F64, "K-FAC norm")


# ----------------------------------------------------------------------------- small errors, exactly

def _rational_rel_err(a, E):
    """e for the float64 rows a~ (M, p) and factors E (M, R, n) (B_i = E_i^T E_i), in exact
    rational arithmetic on the floats' values: the only rounding is the final sqrt."""
    M, p, n = a.shape[0], a.shape[1], E.shape[2]
    a = [[Fraction(float(v)) for v in row] for row in a]
    B = []
    for Ei in E:
        Ei = [[Fraction(float(v)) for v in row] for row in Ei]
        B.append([[sum(r[q] * r[s] for r in Ei) for s in range(n)] for q in range(n)])
    A_sum = [[sum(ai[u] * ai[v] for ai in a) for v in range(p)] for u in range(p)]
    B_sum = [[sum(Bi[q][s] for Bi in B) for s in range(n)] for q in range(n)]
    num = den = Fraction(0)
    for u in range(p):
        for v in range(p):
            for q in range(n):
                for s in range(n):
                    Y = sum(a[i][u] * a[i][v] * B[i][q][s] for i in range(M))
                    num += (A_sum[u][v] * B_sum[q][s] / M - Y) ** 2
                    den += Y * Y
    return math.sqrt(num / den)


def _expanded_rel_err(a, E):
    """The cancelling form sqrt(||X||^2 - 2 <X, Y> + ||Y||^2) / ||Y|| in float64."""
    M = a.shape[0]
    Kp = (a @ a.T) ** 2
    Kb = (np.einsum("ian,jbn->iajb", E, E) ** 2).sum(axis=(1, 3))
    A = a.T @ a / M
    x2, y2 = Kp.sum() * Kb.sum() / M**2, (Kp * Kb).sum()
    xy = sum((a[i] @ A @ a[i]) * Kb[i].sum() for i in range(M))
    return math.sqrt(max(x2 - 2 * xy + y2, 0.0) / y2)


def _nearby_rows(n, M, spread, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n) + spread * rng.standard_normal((M, n))


@pytest.mark.parametrize("spread", [1e-2, 1e-4, 1e-6])
def test_small_errors_keep_their_digits(spread):
    """Rows within `spread` of each other: e ~ spread^2 (down to ~1e-12), exact to rounding
    against rational arithmetic on the same float64 factors, while the expanded form has an
    absolute floor ~1e-8 (it returns 0, or loses most digits, here)."""
    # GGN of a softmax regression: a~ = [x, 1], E_i = C_i^T (the likelihood's Hessian factor)
    model = SoftmaxRegression(3, 3)
    theta = np.random.default_rng(7).standard_normal(model.D)
    X, y = _nearby_rows(3, 3, spread, seed=1), np.array([0, 1, 2])
    a = np.concatenate([X, np.ones((3, 1))], axis=1)
    E = np.swapaxes(model.likelihood.hess_factor(model.forward(theta, X), y), 1, 2)
    exact = _rational_rel_err(a, E)
    got = float(model.kfac_block_errors(theta, X, y, "ggn")["rel_err"][0])
    assert abs(got - exact) <= EXACT_F64 * exact, (got, exact)
    assert exact < 1e-3 and abs(_expanded_rel_err(a, E) - exact) > 1e-7 * exact

    # EF of a two-layer tanh net: a~ and g from kfac_factors, layer by layer
    net = MLP([3, 3, 2], "tanh", "categorical")
    theta = np.random.default_rng(8).standard_normal(net.D)
    X, y = _nearby_rows(3, 3, spread, seed=2), np.array([0, 0, 0])
    got = net.kfac_block_errors(theta, X, y, "ef")["rel_err"]
    for l, (a, g) in enumerate(net.kfac_factors(theta, X, y)):
        a = np.concatenate([a, np.ones((3, 1))], axis=1)
        exact = _rational_rel_err(a, g[:, None, :])
        assert abs(got[l] - exact) <= EXACT_F64 * exact, (l, got[l], exact)


# ----------------------------------------------------------------------------- bad input

NET = MLP([3, 4, 3], "tanh", "categorical")
TH = np.random.default_rng(0).standard_normal(NET.D)
XB = np.random.default_rng(1).standard_normal((5, 3))
YB = np.array([0, 2, 1, 1, 0])

BAD = [
    ("curvature-name", lambda: NET.kfac_block_errors(TH, XB, YB, "hessian"),
     r"curvature: expected 'ggn' or 'ef', got 'hessian'"),
    ("curvature-none", lambda: NET.kfac_block_errors(TH, XB, YB, None),
     r"curvature: expected 'ggn' or 'ef', got None"),
    ("theta-length", lambda: NET.kfac_block_errors(TH[:-1], XB, YB),
     r"theta: expected shape \(31,\) for sizes \[3, 4, 3\], got \(30,\)"),
    ("X-columns", lambda: NET.kfac_block_errors(TH, XB[:, :2], YB), r"X: expected shape \(M, 3\)"),
    ("X-empty", lambda: NET.kfac_block_errors(TH, XB[:0], YB[:0]), "X: expected at least one row"),
    ("X-dtype-mix", lambda: NET.kfac_block_errors(TH, XB.astype(np.float32), YB),
     "theta, X: expected one dtype"),
    ("y-length", lambda: NET.kfac_block_errors(TH, XB, YB[:-1]), r"y: expected shape \(5\), got \(4,\)"),
    ("y-label", lambda: NET.kfac_block_errors(TH, XB, YB + 1), "y: "),
    ("y-missing", lambda: NET.kfac_block_errors(TH, XB, None), "y: expected targets"),
]


@pytest.mark.parametrize("call, match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
