"""The masked network of MC dropout (refbayes.models.dropout) against autograd of the masked
loss written layer by layer (tests/reference/bbb_dense.py), and against the plain model when
every mask is one."""
import autograd
import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.models import MLP, LogisticRegression
from refbayes.models import dropout as dr
from tests.reference import bbb_dense as ref
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

M = 7

CASES = {
    "mlp-tanh-gauss2": MLP([3, 5, 4, 2], activation="tanh", likelihood="gaussian",
                           noise_precision=2.5),
    "mlp-relu-categorical": MLP([4, 6, 3], activation="relu", likelihood="categorical"),
    "mlp-sigmoid-bernoulli": MLP([3, 4, 1], activation="sigmoid", likelihood="bernoulli"),
    "logreg": LogisticRegression(3),
    "logreg-no-intercept": LogisticRegression(3, intercept=False),
}


def _data(model, seed=0):
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(model.D) * 0.7
    X = rng.standard_normal((M, model.sizes[0]))
    K, name = model.sizes[-1], model.likelihood.name
    if name == "gaussian":
        y = rng.standard_normal((M, K))
    elif name == "bernoulli":
        y = rng.integers(0, 2, M).astype(float)
    else:
        y = rng.integers(0, K, M)
    masks = [(rng.random((M, n)) >= 0.3).astype(float) for n in model.sizes[:-1]]
    return theta, X, y, masks


@pytest.mark.parametrize("scale", [1.0, 1 / 0.7])
@pytest.mark.parametrize("name", list(CASES))
def test_masked_grad_matches_autograd(name, scale):
    model = CASES[name]
    theta, X, y, masks = _data(model)
    g = dr.masked_grad(model, theta, X, y, masks, scale)
    g_ref = autograd.grad(ref.masked_loss, 1)(model, theta, X, y, masks, scale)
    assert_close(g, g_ref, EXACT_F64, "masked gradient")
    losses = dr.masked_per_example_losses(model, theta, X, y, masks, scale)
    assert losses.shape == (M,)
    assert_close(losses.sum(), ref.masked_loss(model, theta, X, y, masks, scale), EXACT_F64,
                 "masked loss")
    assert_close(dr.masked_forward(model, theta, X, masks, scale),
                 ref.masked_outputs(model, theta, X, masks, scale), EXACT_F64, "masked outputs")


@pytest.mark.parametrize("name", list(CASES))
def test_masked_per_example_grads_match_autograd_rows(name):
    model = CASES[name]
    theta, X, y, masks = _data(model, seed=1)
    G = dr.masked_per_example_grads(model, theta, X, y, masks, 1 / 0.8)
    rows = [autograd.grad(ref.masked_loss, 1)(model, theta, X[i:i + 1], y[i:i + 1],
                                              [z[i:i + 1] for z in masks], 1 / 0.8)
            for i in range(M)]
    assert_close(G, np.stack(rows), EXACT_F64, "per-example rows")


@pytest.mark.parametrize("name", list(CASES))
def test_all_ones_masks_at_scale_one_are_the_plain_model(name):
    model = CASES[name]
    theta, X, y, _ = _data(model, seed=2)
    ones = [np.ones((M, n)) for n in model.sizes[:-1]]
    assert_close(dr.masked_forward(model, theta, X, ones, 1.0), model.forward(theta, X),
                 EXACT_F64, "forward")
    assert_close(dr.masked_grad(model, theta, X, y, ones, 1.0), model.grad(theta, X, y),
                 EXACT_F64, "gradient")
    assert_close(dr.masked_per_example_losses(model, theta, X, y, ones, 1.0),
                 model.per_example_losses(theta, X, y), EXACT_F64, "losses")


def test_scale_is_a_rescaling_of_the_weights():
    """(s a) W = a (s W): all-ones masks at scale s equal the plain model with every W_k times s
    (biases unchanged), the identity behind the inverted-dropout weight decay (mc_dropout.md)."""
    model = CASES["mlp-tanh-gauss2"]
    theta, X, _, _ = _data(model, seed=3)
    s = 1 / 0.6
    params = model.unflatten(theta)
    scaled = model.flatten([(s * W, b) for W, b in params])
    ones = [np.ones((M, n)) for n in model.sizes[:-1]]
    assert_close(dr.masked_forward(model, theta, X, ones, s), model.forward(scaled, X),
                 EXACT_F64, "inverted scale as weight scale")


def test_bool_and_integer_masks_are_accepted():
    model = CASES["mlp-relu-categorical"]
    theta, X, y, masks = _data(model, seed=4)
    g = dr.masked_grad(model, theta, X, y, masks, 1.25)
    for kind in (bool, np.int64):
        assert_close(dr.masked_grad(model, theta, X, y, [z.astype(kind) for z in masks], 1.25), g,
                     EXACT_F64, f"masks of dtype {kind}")


def test_float32_matches_float64():
    model = CASES["mlp-tanh-gauss2"]
    theta, X, y, masks = _data(model, seed=5)
    g64 = dr.masked_grad(model, theta, X, y, masks, 1 / 0.9)
    g32 = dr.masked_grad(model, theta.astype(np.float32), X.astype(np.float32),
                         y.astype(np.float32), masks, 1 / 0.9)
    assert g32.dtype == np.float32
    assert_close(g32, g64, EXACT_F32, "float32 gradient")


_BAD = [
    (lambda ms: ms[:-1], "masks: expected a list of 3 arrays"),
    (lambda ms: ms[0], "masks: expected a list of 3 arrays"),
    (lambda ms: [ms[0][:, :2]] + ms[1:], r"masks\[0\]: expected shape \(7, 3\)"),
    (lambda ms: [ms[0][:4]] + ms[1:], r"masks\[0\]: expected shape \(7, 3\)"),
    (lambda ms: ms[:1] + [0.5 * ms[1]] + ms[2:], r"masks\[1\]: expected binary values"),
    (lambda ms: ms[:2] + [np.full_like(ms[2], np.nan)], r"masks\[2\]: expected finite"),
]


@pytest.mark.parametrize("edit, match", _BAD, ids=[str(i) for i in range(len(_BAD))])
def test_bad_masks_raise(edit, match):
    model = CASES["mlp-tanh-gauss2"]
    theta, X, y, masks = _data(model)
    with pytest.raises(ValueError, match=match):
        dr.masked_grad(model, theta, X, y, edit(masks), 1.0)


def test_bad_scale_and_model_raise():
    model = CASES["mlp-tanh-gauss2"]
    theta, X, _, masks = _data(model)
    with pytest.raises(ValueError, match=r"scale: expected a value in \[1.0, inf\)"):
        dr.masked_forward(model, theta, X, masks, 0.5)
    with pytest.raises(ValueError, match="model: expected a refbayes.models model"):
        dr.masked_forward("mlp", theta, X, masks, 1.0)
    with pytest.raises(ValueError, match="theta: expected shape"):
        dr.masked_forward(model, theta[:-1], X, masks, 1.0)


def test_masked_grad_on_each_backend_matches_autograd(xp):
    model = CASES["mlp-relu-categorical"]
    theta, X, y, masks = _data(model, seed=6)
    g = dr.masked_grad(model, xp.asarray(theta), xp.asarray(X), xp.asarray(y),
                       [xp.asarray(z) for z in masks], 1.25)
    assert_close(to_numpy(g), autograd.grad(ref.masked_loss, 1)(model, theta, X, y, masks, 1.25),
                 EXACT_F64, "masked gradient")
