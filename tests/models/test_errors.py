"""Bad input: every case raises ValueError naming the argument (never silent broadcasting)."""
import sys
import types

import numpy as np
import pytest

from refbayes.models import MLP, LogisticRegression, SoftmaxRegression, add_intercept

RNG = np.random.default_rng(0)
REG = MLP([3, 4, 2], "tanh", "gaussian")
CLS = MLP([3, 4, 3], "relu", "categorical")
LOG = LogisticRegression(3)
TH_REG, TH_CLS, TH_LOG = (RNG.standard_normal(m.D) for m in (REG, CLS, LOG))
X = RNG.standard_normal((5, 3))
Y_REG = RNG.standard_normal((5, 2))
Y_CLS = np.array([0, 2, 1, 1, 0])
Y_LOG = np.array([0, 1, 1, 0, 1])


def _nan(a, where=0):
    a = a.copy()
    a.flat[where] = np.nan
    return a


BAD = [
    ("theta-length", lambda: REG.loss(TH_REG[:-1], X, Y_REG), r"theta: expected shape \(26,\) for sizes \[3, 4, 2\], got \(25,\)"),
    ("theta-2d", lambda: REG.grad(TH_REG[None], X, Y_REG), "theta: expected 1 dimensions"),
    ("theta-int", lambda: REG.forward(np.zeros(REG.D, dtype=int), X), r"theta: expected a floating dtype \(float64 or float32\)"),
    ("theta-nan", lambda: REG.per_example_grads(_nan(TH_REG), X, Y_REG), "theta: expected finite"),
    ("X-columns", lambda: REG.forward(TH_REG, X[:, :2]), r"X: expected shape \(M, 3\)"),
    ("X-1d", lambda: REG.forward(TH_REG, X[0]), "X: expected 2 dimensions"),
    ("X-empty", lambda: REG.forward(TH_REG, X[:0]), "X: expected at least one row"),
    ("X-inf", lambda: CLS.ggn(TH_CLS, X * np.inf, Y_CLS), "X: expected finite"),
    ("X-dtype-mix", lambda: REG.grad(TH_REG, X.astype(np.float32), Y_REG), "theta, X: expected one dtype"),
    ("y-length", lambda: CLS.loss(TH_CLS, X, Y_CLS[:-1]), r"y: expected shape \(5\), got \(4,\)"),
    ("y-reg-shape", lambda: REG.loss(TH_REG, X, Y_REG[:, 0]), r"y: expected shape \(5, 2\)"),
    ("y-reg-nan", lambda: REG.diag_ggn(TH_REG, X, _nan(Y_REG)), "y: expected finite"),
    ("y-missing", lambda: REG.loss(TH_REG, X, None), "y: expected targets"),
    ("y-label-high", lambda: CLS.grad(TH_CLS, X, np.array([0, 3, 1, 1, 0])), r"y: expected labels in \{0, ..., 2\}"),
    ("y-label-negative", lambda: CLS.diag_ef(TH_CLS, X, np.array([0, -1, 1, 1, 0])), "y: expected labels"),
    ("y-label-2-bernoulli", lambda: LOG.loss(TH_LOG, X, np.array([0, 1, 2, 0, 1])), r"y: expected labels in \{0, ..., 1\}"),
    ("y-fractional-labels", lambda: LOG.loss(TH_LOG, X, Y_LOG * 0.5), "y: expected integer class labels"),
    ("impl-unknown", lambda: REG.per_example_grads(TH_REG, X, Y_REG, impl="jax"), "impl: expected one of"),
    ("activation", lambda: MLP([3, 2], activation="gelu"), "activation: expected one of"),
    ("likelihood", lambda: MLP([3, 2], likelihood="poisson"), "likelihood: expected one of"),
    ("noise-precision", lambda: MLP([3, 2], noise_precision=0.0), "noise_precision"),
    ("sizes-short", lambda: MLP([3]), "sizes: expected a list"),
    ("sizes-zero", lambda: MLP([3, 0, 1]), r"sizes\[1\]: expected an integer in \[1"),
    ("sizes-float", lambda: MLP([3, 2.5, 1]), r"sizes\[1\]: expected an integer"),
    ("bernoulli-width", lambda: MLP([3, 2], likelihood="bernoulli"), "n_out == 1"),
    ("categorical-width", lambda: MLP([3, 1], likelihood="categorical"), "n_out >= 2"),
    ("n-classes", lambda: SoftmaxRegression(3, 1), "n_classes"),
    ("n-features", lambda: LogisticRegression(0), "n_features"),
    ("flatten-count", lambda: REG.flatten([(np.zeros((3, 4)), np.zeros(4))]), "params: expected a list of 2"),
    ("flatten-shape", lambda: REG.flatten([(np.zeros((4, 3)), np.zeros(4)), (np.zeros((4, 2)), np.zeros(2))]),
     r"params\[0\]\[0\] \(W_1\): expected shape \(3, 4\)"),
    ("flatten-bias-missing", lambda: REG.flatten([(np.zeros((3, 4)), None), (np.zeros((4, 2)), np.zeros(2))]),
     r"params\[0\]\[1\] \(b_1\)"),
    ("flatten-bias-extra", lambda: LogisticRegression(3, intercept=False).flatten([(np.zeros((3, 1)), np.zeros(1))]),
     "no bias"),
    ("unflatten-length", lambda: REG.unflatten(TH_REG[:5]), "theta: expected shape"),
    ("init-rng", lambda: REG.init_theta(0), "rng: expected a numpy.random.Generator"),
    ("init-dtype", lambda: REG.init_theta(np.random.default_rng(0), dtype=np.int32), "dtype"),
    ("add-intercept-1d", lambda: add_intercept(np.zeros(3)), "X: expected 2 dimensions"),
    ("hessian-label", lambda: CLS.hessian(TH_CLS, X, np.array([0, 5, 1, 1, 0])), "y: expected labels"),
    ("kfac-y", lambda: CLS.kfac_factors(TH_CLS, X, Y_CLS[:3]), "y: expected shape"),
    ("jacobian-X", lambda: CLS.jacobian(TH_CLS, X.T), "X: expected shape"),
]


@pytest.mark.parametrize("call, match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


class _FakeDeviceArray(np.ndarray):
    """Stands in for cupy.ndarray: refbayes.backend recognises CuPy by isinstance on sys.modules['cupy']."""


@pytest.fixture
def fake_cupy(monkeypatch):
    """A module named cupy whose ndarray is _FakeDeviceArray and whose functions are NumPy's."""
    mod = types.ModuleType("cupy")
    mod.__getattr__ = lambda name: getattr(np, name)
    mod.ndarray = _FakeDeviceArray
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


@pytest.mark.parametrize("impl", ["numba", "autograd"])
def test_numpy_only_impls_refuse_device_arrays(fake_cupy, impl):
    theta, Xd = TH_REG.view(_FakeDeviceArray), X.view(_FakeDeviceArray)
    with pytest.raises(ValueError, match=f"impl: '{impl}' runs on NumPy arrays only"):
        REG.per_example_grads(theta, Xd, Y_REG.view(_FakeDeviceArray), impl=impl)


def test_autograd_hessian_refuses_device_arrays(fake_cupy):
    with pytest.raises(ValueError, match="theta: the autograd Hessian needs NumPy"):
        REG.hessian(TH_REG.view(_FakeDeviceArray), X.view(_FakeDeviceArray), Y_REG.view(_FakeDeviceArray))


@pytest.mark.parametrize("impl", ["numba", "autograd"])
def test_numpy_only_impls_refuse_cupy(xp, impl):
    if xp is np:
        pytest.skip("needs real CuPy arrays (the fake-module test covers the check on CPU)")
    with pytest.raises(ValueError, match="runs on NumPy arrays only"):
        REG.per_example_grads(xp.asarray(TH_REG), xp.asarray(X), xp.asarray(Y_REG), impl=impl)


def test_mixed_backends_refused(fake_cupy):
    with pytest.raises(ValueError, match="arrays: expected all on one backend"):
        REG.grad(TH_REG.view(_FakeDeviceArray), X, Y_REG)
