"""theta layout, flatten/unflatten, add_intercept, and linear models == one-layer MLPs."""
import numpy as np
import pytest

from refbayes.models import MLP, LogisticRegression, SoftmaxRegression, add_intercept, warmup
from tests.models.cases import CASES, Case, batch, ids
from tests.tolerances import EXACT_F64, assert_close


def test_flatten_order_is_documented_order():
    model = MLP([2, 3, 1])
    W1 = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    b1 = np.array([7.0, 8.0, 9.0])
    W2 = np.array([[10.0], [11.0], [12.0]])
    b2 = np.array([13.0])
    theta = model.flatten([(W1, b1), (W2, b2)])
    np.testing.assert_array_equal(theta, np.arange(1.0, 14.0))
    (V1, c1), (V2, c2) = model.unflatten(theta)
    for got, want in ((V1, W1), (c1, b1), (V2, W2), (c2, b2)):
        np.testing.assert_array_equal(got, want)


def test_no_intercept_layout():
    model = SoftmaxRegression(2, 3, intercept=False)
    W = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(model.flatten([(W, None)]), np.arange(6.0))
    (V, b), = model.unflatten(np.arange(6.0))
    assert b is None
    np.testing.assert_array_equal(V, W)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_round_trip(case, xp):
    theta = batch(case, xp=xp)[0]
    params = case.model.unflatten(theta)
    assert [W.shape for W, _ in params] == list(zip(case.model.sizes[:-1], case.model.sizes[1:]))
    back = case.model.flatten(params)
    assert back.shape == theta.shape and bool(xp.all(back == theta))


def test_add_intercept_appends_ones_last(xp):
    X = xp.asarray(np.arange(6.0).reshape(3, 2))
    Xa = add_intercept(X)
    assert Xa.shape == (3, 3) and Xa.dtype == X.dtype
    assert bool(xp.all(Xa[:, :2] == X)) and bool(xp.all(Xa[:, 2] == 1.0))
    assert add_intercept(X.astype(xp.float32)).dtype == xp.float32


@pytest.mark.parametrize("linear, mlp", [
    (LogisticRegression(4), MLP([4, 1], likelihood="bernoulli")),
    (SoftmaxRegression(4, 3), MLP([4, 3], likelihood="categorical")),
], ids=["logistic", "softmax"])
def test_linear_model_equals_one_layer_mlp(linear, mlp):
    theta, X, y = batch(Case("x", linear))
    assert linear.D == mlp.D
    for method in ("forward", "predict"):
        assert_close(getattr(linear, method)(theta, X), getattr(mlp, method)(theta, X), EXACT_F64, method)
    for method in ("per_example_losses", "grad", "per_example_grads", "ggn", "diag_ggn", "diag_ef"):
        assert_close(getattr(linear, method)(theta, X, y), getattr(mlp, method)(theta, X, y), EXACT_F64, method)
    # closed form (linear) vs autograd (MLP)
    assert_close(linear.hessian(theta, X, y), mlp.hessian(theta, X, y), EXACT_F64, "hessian")


@pytest.mark.parametrize("linear_cls, extra", [(LogisticRegression, ()), (SoftmaxRegression, (3,))],
                         ids=["logistic", "softmax"])
def test_intercept_is_last_column_of_ones(linear_cls, extra):
    """intercept=True on X is intercept=False on add_intercept(X), for the same theta."""
    with_b, without_b = linear_cls(4, *extra), linear_cls(5, *extra, intercept=False)
    theta, X, y = batch(Case("x", with_b))
    Xa = add_intercept(X)
    for method in ("per_example_losses", "per_example_grads", "ggn", "hessian", "diag_ggn"):
        assert_close(getattr(with_b, method)(theta, X, y), getattr(without_b, method)(theta, Xa, y),
                     EXACT_F64, method)


def test_logistic_ggn_closed_form():
    """(peg.20): X~^T diag(s (1 - s)) X~ by hand."""
    model = LogisticRegression(3)
    theta, X, y = batch(Case("x", model))
    Xa = np.hstack([X, np.ones((len(X), 1))])
    s = 1.0 / (1.0 + np.exp(-Xa @ theta))
    assert_close(model.ggn(theta, X, y), Xa.T @ np.diag(s * (1 - s)) @ Xa, EXACT_F64, "logistic GGN")


def test_attributes_and_immutability():
    model = MLP([3, 4, 2], "tanh", "categorical")
    assert model.sizes == (3, 4, 2) and model.D == 3 * 4 + 4 + 4 * 2 + 2
    assert LogisticRegression(3, intercept=False).D == 3 and SoftmaxRegression(3, 4).D == 16
    assert LogisticRegression(3).intercept and not SoftmaxRegression(3, 2, intercept=False).intercept
    assert model == MLP([3, 4, 2], "tanh", "categorical") and hash(model) == hash(MLP((3, 4, 2), "tanh", "categorical"))
    assert model != MLP([3, 4, 2], "relu", "categorical")
    assert "tanh" in repr(model)
    with pytest.raises(AttributeError):
        model.D = 3


def test_init_theta_glorot():
    model = MLP([30, 20, 1])
    theta = model.init_theta(np.random.default_rng(0))
    (W1, b1), (W2, b2) = model.unflatten(theta)
    s1, s2 = np.sqrt(6 / 50), np.sqrt(6 / 21)
    assert np.all(np.abs(W1) <= s1) and np.abs(W1).max() > 0.9 * s1
    assert np.all(np.abs(W2) <= s2) and np.abs(W2).max() > 0.5 * s2
    assert np.all(b1 == 0) and np.all(b2 == 0)
    np.testing.assert_array_equal(theta, model.init_theta(np.random.default_rng(0)))
    assert model.init_theta(np.random.default_rng(0), dtype=np.float32).dtype == np.float32


def test_init_theta_pytorch_is_torch_linear_default():
    """scheme="pytorch": W_l and b_l ~ U(+-1/sqrt(n_in)), drawn W_l then b_l per layer."""
    model = MLP([30, 20, 1])
    theta = model.init_theta(np.random.default_rng(0), scheme="pytorch")
    rng = np.random.default_rng(0)
    s1, s2 = 1 / np.sqrt(30), 1 / np.sqrt(20)
    expected = [(rng.uniform(-s1, s1, (30, 20)), rng.uniform(-s1, s1, 20)),
                (rng.uniform(-s2, s2, (20, 1)), rng.uniform(-s2, s2, 1))]
    np.testing.assert_array_equal(theta, model.flatten(expected))
    (W1, b1), _ = model.unflatten(theta)
    assert np.abs(W1).max() > 0.9 * s1 and np.abs(b1).max() > 0.5 * s1
    assert model.init_theta(np.random.default_rng(0), np.float32, "pytorch").dtype == np.float32
    with pytest.raises(ValueError, match="scheme: expected one of"):
        model.init_theta(np.random.default_rng(0), scheme="he")


def test_init_theta_pytorch_bounds_are_torchs():
    """The bound 1 / sqrt(n_in) of both W and b is torch.nn.Linear's own: its 60,000 biases and
    1.8 million weights reach within 0.1 % of it and never beyond (a miss has probability
    0.999^60000 ~ 1e-26)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    layer = torch.nn.Linear(30, 60000)
    for name, values in (("weight", layer.weight), ("bias", layer.bias)):
        top = float(values.detach().abs().max())
        assert 0.999 / np.sqrt(30) < top <= 1 / np.sqrt(30) * (1 + 1e-7), name


def test_warmup_runs():
    warmup()
