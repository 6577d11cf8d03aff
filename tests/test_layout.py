"""refbayes.layout: permutations between refbayes' theta and the torch / flax flat layouts.

Pure permutations are checked for exact equality; the torch layout is checked against a vector
built by hand from ``model.unflatten`` and, where torch is installed, against a real
``nn.Sequential`` (parameters_to_vector, forward pass, per-example gradients); the flax layout
against a hand-written sorted-key traversal of the ``{"Dense_l": {"bias", "kernel"}}`` dict.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refbayes.layout import (
    LAYOUTS,
    from_layers,
    from_refbayes,
    permutation,
    to_layers,
    to_refbayes,
)
from refbayes.models import MLP, LogisticRegression, SoftmaxRegression, tiny_cnn
from refbayes.models.base import FlatModel
from refbayes.models.likelihoods import Gaussian
from tests.tolerances import EXACT_F64, assert_close

DEEP_SIZES = [2] + [3] * 11 + [2]  # 12 layers: Dense_0 .. Dense_11, so Dense_10 sorts before Dense_2

MODELS = {
    "mlp-3-4-2": MLP([3, 4, 2], activation="tanh", likelihood="categorical"),
    "mlp-5-1": MLP([5, 1]),
    "mlp-deep12": MLP(DEEP_SIZES, activation="tanh"),
    "logistic": LogisticRegression(3),
    "logistic-no-intercept": LogisticRegression(4, intercept=False),
    "softmax": SoftmaxRegression(3, 4),
    "softmax-no-intercept": SoftmaxRegression(3, 4, intercept=False),
    # no public multi-layer class without biases; the layout code must still handle one
    "flat-no-bias-2-3-2": FlatModel((2, 3, 2), "tanh", Gaussian(), bias=False),
}


@pytest.fixture(params=sorted(MODELS))
def model(request):
    return MODELS[request.param]


def _theta(model, seed=0):
    return np.random.default_rng(seed).standard_normal(model.D)


def _torch_by_hand(model, theta):
    """parameters_to_vector order, built independently: per layer W^T row-major, then b."""
    parts = []
    for W, b in model.unflatten(theta):
        parts.append(W.T.ravel())
        if b is not None:
            parts.append(b)
    return np.concatenate(parts)


def _ravel_sorted(tree):
    """A ravel_pytree stand-in for nested dicts of arrays: keys in sorted order, leaves raveled."""
    if isinstance(tree, dict):
        return np.concatenate([_ravel_sorted(tree[k]) for k in sorted(tree)])
    return np.asarray(tree).ravel()


def _flax_by_hand(model, theta):
    params = {}
    for l, (W, b) in enumerate(model.unflatten(theta)):
        params[f"Dense_{l}"] = {"kernel": W} | ({"bias": b} if b is not None else {})
    return _ravel_sorted({"params": params})


# ----------------------------------------------------------------------------- permutations

def test_permutation_is_a_permutation(model):
    for layout in LAYOUTS:
        p = permutation(model, layout)
        assert p.shape == (model.D,) and p.dtype.kind == "i"
        np.testing.assert_array_equal(np.sort(p), np.arange(model.D))
    np.testing.assert_array_equal(permutation(model, "refbayes"), np.arange(model.D))


def test_permutation_returns_a_fresh_copy():
    m = MODELS["mlp-3-4-2"]
    p = permutation(m, "torch")
    p[:] = 0
    assert sorted(permutation(m, "torch")) == list(range(m.D))


def test_torch_layout_matches_independent_construction(model):
    theta = _theta(model)
    hand = _torch_by_hand(model, theta)
    p = permutation(model, "torch")
    np.testing.assert_array_equal(hand[p], theta)
    np.testing.assert_array_equal(theta[np.argsort(p)], hand)
    np.testing.assert_array_equal(from_refbayes(theta, model, "torch"), hand)
    np.testing.assert_array_equal(to_refbayes(hand, model, "torch"), theta)
    np.testing.assert_array_equal(np.concatenate([t.ravel() for t in to_layers(theta, model, "torch")]), hand)


def test_flax_layout_matches_independent_construction(model):
    theta = _theta(model)
    hand = _flax_by_hand(model, theta)
    np.testing.assert_array_equal(from_refbayes(theta, model, "flax"), hand)
    np.testing.assert_array_equal(to_refbayes(hand, model, "flax"), theta)
    np.testing.assert_array_equal(np.concatenate([t.ravel() for t in to_layers(theta, model, "flax")]), hand)


def test_flax_deep_model_orders_layers_lexicographically():
    m = MODELS["mlp-deep12"]
    D_layer = [(n_in + 1) * n_out for n_in, n_out in zip(m.sizes[:-1], m.sizes[1:])]
    starts = np.concatenate([[0], np.cumsum(D_layer)])
    # mark every refbayes entry with its layer number; the flax vector must visit the layers
    # as sorted strings: Dense_0, Dense_1, Dense_10, Dense_11, Dense_2, ..., Dense_9
    marks = np.repeat(np.arange(m.n_layers), D_layer).astype(float)
    seen = from_refbayes(marks, m, "flax")
    order = [int(v) for k, v in enumerate(seen) if k == 0 or seen[k - 1] != v]
    assert order == [0, 1, 10, 11, 2, 3, 4, 5, 6, 7, 8, 9]
    # and inside Dense_10 (the third block): bias (3,) then kernel (3, 3) row-major
    theta = _theta(m)
    W10, b10 = m.unflatten(theta)[10]
    off = D_layer[0] + D_layer[1]
    flat = from_refbayes(theta, m, "flax")
    np.testing.assert_array_equal(flat[off:off + 3], b10)
    np.testing.assert_array_equal(flat[off + 3:off + 12], W10.ravel())
    assert starts[-1] == m.D


def test_linear_model_intercept_is_the_layer_bias():
    m = LogisticRegression(3)  # theta = [w (3,), b]
    theta = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(from_refbayes(theta, m, "torch"), theta)  # weight (1, 3), bias (1,)
    np.testing.assert_array_equal(from_refbayes(theta, m, "flax"), [4.0, 1.0, 2.0, 3.0])  # bias, kernel
    W, b = to_layers(theta, m, "torch")
    assert W.shape == (1, 3) and b.shape == (1,)


# ----------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("layout", LAYOUTS)
def test_layers_round_trip(model, layout):
    theta = _theta(model)
    tensors = to_layers(theta, model, layout)
    assert len(tensors) == model.n_layers * (2 if model.bias else 1)
    back = from_layers(tensors, model, layout)
    assert back.dtype == theta.dtype
    np.testing.assert_array_equal(back, theta)
    # from_layers reads the tensors, whatever memory they live in
    np.testing.assert_array_equal(from_layers([t.copy() for t in tensors], model, layout), theta)


def test_layers_shapes():
    m = MODELS["mlp-3-4-2"]
    theta = _theta(m)
    (W1, _), (_, b2) = m.unflatten(theta)
    shapes = {lay: [t.shape for t in to_layers(theta, m, lay)] for lay in LAYOUTS}
    assert shapes == {"refbayes": [(3, 4), (4,), (4, 2), (2,)],
                      "torch": [(4, 3), (4,), (2, 4), (2,)],
                      "flax": [(4,), (3, 4), (2,), (4, 2)]}
    t = to_layers(theta, m, "torch")
    np.testing.assert_array_equal(t[0], W1.T)
    assert t[0].flags.c_contiguous
    np.testing.assert_array_equal(t[3], b2)
    f = to_layers(theta, m, "flax")
    np.testing.assert_array_equal(f[1], W1)
    np.testing.assert_array_equal(f[2], b2)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("axes", [(0,), (-1,), (0, 1)])
def test_array_round_trip_exact(model, layout, axes):
    rng = np.random.default_rng(1)
    D = model.D
    shape = {(0,): (D, 3), (-1,): (2, 3, D), (0, 1): (D, D)}[axes]
    a = rng.standard_normal(shape)
    np.testing.assert_array_equal(to_refbayes(from_refbayes(a, model, layout, axes), model, layout, axes), a)
    np.testing.assert_array_equal(from_refbayes(to_refbayes(a, model, layout, axes), model, layout, axes), a)
    p = permutation(model, layout)
    want = {(0,): lambda: a[p], (-1,): lambda: a[..., p], (0, 1): lambda: a[p][:, p]}[axes]()
    np.testing.assert_array_equal(to_refbayes(a, model, layout, axes), want)


def test_precision_matrix_converts_as_a_bilinear_form():
    # x^T P x is invariant when x and P are permuted consistently
    m = MODELS["mlp-3-4-2"]
    rng = np.random.default_rng(2)
    A = rng.standard_normal((m.D, m.D))
    P_torch, x_torch = A @ A.T, rng.standard_normal(m.D)
    P = to_refbayes(P_torch, m, "torch", axes=(0, 1))
    x = to_refbayes(x_torch, m, "torch")
    assert_close(x @ P @ x, x_torch @ P_torch @ x_torch, EXACT_F64, "x^T P x")
    np.testing.assert_array_equal(np.diag(P), to_refbayes(np.diag(P_torch), m, "torch"))


def test_dtype_and_int_axis_accepted():
    m = MODELS["mlp-3-4-2"]
    a = np.arange(2 * m.D, dtype=np.float32).reshape(m.D, 2)
    out = to_refbayes(a, m, "flax", axes=0)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, to_refbayes(a, m, "flax", axes=(np.int64(0),)))
    assert to_refbayes(a, m, "refbayes", axes=0) is not a  # a new array, even for the identity


def test_backend_array(xp):
    m = MODELS["mlp-3-4-2"]
    a_np = np.random.default_rng(3).standard_normal((m.D, m.D))
    a = xp.asarray(a_np)
    out = to_refbayes(a, m, "torch", axes=(0, 1))
    assert type(out) is type(a)
    np.testing.assert_array_equal(np.asarray(out.get() if hasattr(out, "get") else out),
                                  to_refbayes(a_np, m, "torch", axes=(0, 1)))
    theta = xp.asarray(_theta(m))
    back = from_layers(to_layers(theta, m, "torch"), m, "torch")
    assert type(back) is type(theta)
    assert bool(xp.all(back == theta))
    mu_rho = np.random.default_rng(4).standard_normal(2 * m.D)  # BBB's [mu; rho], blocks=2
    out = from_refbayes(xp.asarray(mu_rho), m, "torch", blocks=2)
    assert type(out) is type(a)
    np.testing.assert_array_equal(np.asarray(out.get() if hasattr(out, "get") else out),
                                  from_refbayes(mu_rho, m, "torch", blocks=2))


@st.composite
def _models(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=2, max_size=14))
    bias = draw(st.booleans())
    return FlatModel(tuple(sizes), "tanh", Gaussian(), bias=bias)


@given(model=_models(), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**32 - 1))
def test_round_trips_hypothesis(model, layout, seed):
    theta = np.random.default_rng(seed).standard_normal(model.D)
    flat = from_refbayes(theta, model, layout)
    np.testing.assert_array_equal(to_refbayes(flat, model, layout), theta)
    np.testing.assert_array_equal(from_layers(to_layers(theta, model, layout), model, layout), theta)
    np.testing.assert_array_equal(np.concatenate([t.ravel() for t in to_layers(theta, model, layout)]), flat)
    hand = {"refbayes": theta, "torch": _torch_by_hand(model, theta), "flax": _flax_by_hand(model, theta)}
    np.testing.assert_array_equal(flat, hand[layout])


# ----------------------------------------------------------------------------- bad input

def test_unknown_layout():
    m = MODELS["mlp-3-4-2"]
    for call in (lambda: permutation(m, "jax"), lambda: to_refbayes(np.zeros(m.D), m, "tf"),
                 lambda: from_refbayes(np.zeros(m.D), m, "Torch"), lambda: to_layers(np.zeros(m.D), m, "keras"),
                 lambda: from_layers([], m, None)):
        with pytest.raises(ValueError, match=r"layout: expected one of \('refbayes', 'torch', 'flax'\)"):
            call()


def test_not_a_model():
    with pytest.raises(ValueError, match="model: expected a refbayes FlatModel"):
        permutation([3, 4, 2], "torch")


def test_axis_of_wrong_length():
    m = MODELS["mlp-3-4-2"]
    with pytest.raises(ValueError, match=rf"a: expected length D = {m.D} along axis 1"):
        to_refbayes(np.zeros((m.D, m.D + 1)), m, "torch", axes=(0, 1))
    with pytest.raises(ValueError, match=rf"a: expected length D = {m.D} along axis 0"):
        from_refbayes(np.zeros((m.D - 1, m.D)), m, "flax", axes=(0,))
    with pytest.raises(ValueError, match=r"a: expected length D"):
        to_refbayes(np.zeros(1), m, "torch")  # no broadcasting of a length-1 axis


@pytest.mark.parametrize("axes", [(0.0,), ("0",), (True,), (None,), (0, 1.5)])
def test_non_integer_axes(axes):
    m = MODELS["mlp-3-4-2"]
    with pytest.raises(ValueError, match=r"axes\[\d\]: expected an int"):
        to_refbayes(np.zeros((m.D, m.D)), m, "torch", axes=axes)


@pytest.mark.parametrize("axes", [(0, 0), (1, -1), (0, -2)])
def test_duplicate_axes(axes):
    m = MODELS["mlp-3-4-2"]
    with pytest.raises(ValueError, match="axes: expected distinct axes"):
        from_refbayes(np.zeros((m.D, m.D)), m, "torch", axes=axes)


def test_bad_axes_container_and_range():
    m = MODELS["mlp-3-4-2"]
    a = np.zeros((m.D, m.D))
    with pytest.raises(ValueError, match="axes: expected a non-empty tuple of ints"):
        to_refbayes(a, m, "torch", axes=())
    with pytest.raises(ValueError, match="axes: expected a non-empty tuple of ints"):
        to_refbayes(a, m, "torch", axes="0")
    with pytest.raises(ValueError, match=r"axes\[0\]: expected an axis in \[-2, 1\]"):
        to_refbayes(a, m, "torch", axes=(2,))
    with pytest.raises(ValueError, match="a: expected a NumPy or CuPy array"):
        to_refbayes(list(range(m.D)), m, "torch")


def test_from_layers_wrong_number():
    m = MODELS["mlp-3-4-2"]
    tensors = to_layers(_theta(m), m, "torch")
    with pytest.raises(ValueError, match=r"params: expected a list of 4 arrays for the 'torch' layout "
                                         r"\(weight_1 \(4, 3\), bias_1 \(4,\).*got list of length 3"):
        from_layers(tensors[:3], m, "torch")
    with pytest.raises(ValueError, match="params: expected a list of 4 arrays"):
        from_layers(np.concatenate([t.ravel() for t in tensors]), m, "torch")
    m0 = MODELS["softmax-no-intercept"]
    with pytest.raises(ValueError, match=r"params: expected a list of 1 arrays for the 'flax' layout"):
        from_layers(to_layers(_theta(m), m, "flax"), m0, "flax")


def test_from_layers_wrong_shape():
    m = MODELS["mlp-3-4-2"]
    theta = _theta(m)
    # refbayes-shaped weights given as torch tensors: caught, not transposed silently
    with pytest.raises(ValueError, match=r"params\[0\] \(torch weight_1\): expected shape \(4, 3\), got \(3, 4\)"):
        from_layers(to_layers(theta, m, "refbayes"), m, "torch")
    # torch order given as flax: the bias slot receives a weight
    with pytest.raises(ValueError, match=r"params\[0\] \(flax Dense_0/bias\): expected shape \(4,?\), got \(4, 3\)"):
        from_layers(to_layers(theta, m, "torch"), m, "flax")
    t = to_layers(theta, m, "refbayes")
    t[1] = t[1][None, :]  # (1, 4): no broadcasting
    with pytest.raises(ValueError, match=r"params\[1\] \(refbayes b_1\): expected shape \(4,?\), got \(1, 4\)"):
        from_layers(t, m, "refbayes")
    t = to_layers(theta, m, "refbayes")
    t[3] = [0.0, 1.0]
    with pytest.raises(ValueError, match=r"params\[3\] \(refbayes b_2\): expected an array, got list"):
        from_layers(t, m, "refbayes")


def test_to_layers_bad_theta():
    m = MODELS["mlp-3-4-2"]
    with pytest.raises(ValueError, match=rf"theta: expected shape \({m.D},\)"):
        to_layers(np.zeros(m.D + 1), m, "torch")
    with pytest.raises(ValueError, match="theta: expected 1 dimensions"):
        to_layers(np.zeros((1, m.D)), m, "flax")


# ----------------------------------------------------------------------------- a real torch network

TORCH_CASES = ["mlp-3-4-2", "mlp-5-1", "mlp-deep12", "logistic", "softmax-no-intercept"]


def _torch_net(torch, model):
    nn = torch.nn
    mods = []
    for l, (n_in, n_out) in enumerate(zip(model.sizes[:-1], model.sizes[1:])):
        if l:
            mods.append({"tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}[model.activation]())
        mods.append(nn.Linear(n_in, n_out, bias=model.bias, dtype=torch.float64))
    return nn.Sequential(*mods)


def _torch_losses(torch, model, f, y):
    """Per-example l_i, up to constants in theta, for the model's likelihood."""
    F = torch.nn.functional
    name = model.likelihood.name
    if name == "gaussian":
        return 0.5 * model.likelihood.noise_precision * ((y.reshape(f.shape) - f) ** 2).sum(-1)
    if name == "bernoulli":
        return F.binary_cross_entropy_with_logits(f[..., 0], y, reduction="none")
    return F.cross_entropy(f, y, reduction="none")


def _data(model, M=7, seed=4):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((M, model.sizes[0]))
    name, K = model.likelihood.name, model.sizes[-1]
    y = {"gaussian": lambda: rng.standard_normal((M, K)),
         "bernoulli": lambda: rng.integers(0, 2, M).astype(float),
         "categorical": lambda: rng.integers(0, K, M)}[name]()
    return X, y


@pytest.mark.parametrize("name", TORCH_CASES)
def test_torch_network(name):
    torch = pytest.importorskip("torch")
    from torch.nn.utils import parameters_to_vector, vector_to_parameters
    model = MODELS[name]
    net = _torch_net(torch, model)
    theta = _theta(model, seed=5)
    # refbayes -> torch: copy the tensors in, compare the vector and the forward pass
    with torch.no_grad():
        for p, t in zip(net.parameters(), to_layers(theta, model, "torch")):
            assert tuple(p.shape) == t.shape
            p.copy_(torch.from_numpy(t))
    vec = parameters_to_vector(net.parameters()).detach().numpy()
    np.testing.assert_array_equal(vec, from_refbayes(theta, model, "torch"))
    np.testing.assert_array_equal(to_refbayes(vec, model, "torch"), theta)
    X, y = _data(model)
    with torch.no_grad():
        f_torch = net(torch.from_numpy(X)).numpy()
    assert_close(model.forward(theta, X), f_torch, EXACT_F64, f"{name}: forward")

    # torch -> refbayes: a vector written into the net converts to the theta of the same function
    vec2 = np.random.default_rng(6).standard_normal(model.D)
    vector_to_parameters(torch.from_numpy(vec2), net.parameters())
    theta2 = to_refbayes(vec2, model, "torch")
    np.testing.assert_array_equal(
        from_layers([p.detach().numpy() for p in net.parameters()], model, "torch"), theta2)
    with torch.no_grad():
        f_torch = net(torch.from_numpy(X)).numpy()
    assert_close(model.forward(theta2, X), f_torch, EXACT_F64, f"{name}: forward after vector_to_parameters")

    # per-example gradients: torch.func in torch's order, converted, equal refbayes'
    from torch.func import functional_call, grad, vmap
    params = {k: v.detach() for k, v in net.named_parameters()}
    yt = torch.from_numpy(y)

    def loss_i(p, x, yi):
        f = functional_call(net, p, (x[None],))
        return _torch_losses(torch, model, f, yi[None])[0]

    g = vmap(grad(loss_i), in_dims=(None, 0, 0))(params, torch.from_numpy(X), yt)
    G_torch = torch.cat([g[k].reshape(X.shape[0], -1) for k in params], dim=1).numpy()
    G = model.per_example_grads(theta2, X, y)
    assert_close(to_refbayes(G_torch, model, "torch"), G, EXACT_F64, f"{name}: per-example gradients")
    assert_close(G_torch, from_refbayes(G, model, "torch"), EXACT_F64, f"{name}: per-example gradients back")


# ----------------------------------------------------------------------------- CNNs (issue 34)

def _cnn_models():
    from refbayes.models import CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten, tiny_cnn
    two = CNN((2, 6, 5), [Conv2d(2, 3, (3, 2), stride=1, padding=1), Activation("tanh"),
                          Conv2d(3, 2, (2, 2), stride=2, bias=False), Activation("relu"),
                          AvgPool2d(1), Flatten(), Dense(2 * 3 * 3, 4), Activation("tanh"),
                          Dense(4, 3)])
    return {"tiny": tiny_cnn(), "two-conv": two}


CNN_MODELS = _cnn_models()


def _nhwc_forward(model, flax_params, x):
    """One image through the CNN the flax way, written out: NHWC maps, kernels (k_h, k_w, C_in,
    C_out), flatten in (h, w, c) order. flax_params: {"Conv_0": {"kernel", "bias"}, ...}."""
    from refbayes.models import Activation, AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d
    a = x.transpose(1, 2, 0)  # (H, W, C)
    n = {"Conv": 0, "Dense": 0}
    for layer in model.layers:
        if isinstance(layer, (Conv2d, Dense)):
            kind = "Conv" if isinstance(layer, Conv2d) else "Dense"
            p = flax_params[f"{kind}_{n[kind]}"]
            n[kind] += 1
            b = p.get("bias", 0.0)
            if kind == "Dense":
                a = a @ p["kernel"] + b
                continue
            (ph, pw), (sh, sw) = layer.padding, layer.stride
            K = p["kernel"]
            kh, kw = K.shape[:2]
            xp_ = np.pad(a, ((ph, ph), (pw, pw), (0, 0)))
            Ho, Wo = (xp_.shape[0] - kh) // sh + 1, (xp_.shape[1] - kw) // sw + 1
            out = np.zeros((Ho, Wo, K.shape[3]))
            for h in range(Ho):
                for w in range(Wo):
                    patch = xp_[sh * h:sh * h + kh, sw * w:sw * w + kw, :]
                    out[h, w] = np.tensordot(patch, K, axes=3) + b
            a = out
        elif isinstance(layer, Activation):
            a = {"tanh": np.tanh, "relu": lambda z: np.maximum(z, 0.0)}[layer.name](a)
        elif isinstance(layer, (MaxPool2d, AvgPool2d)):
            (kh, kw), (sh, sw) = layer.kernel, layer.stride
            Ho, Wo = (a.shape[0] - kh) // sh + 1, (a.shape[1] - kw) // sw + 1
            red = np.max if isinstance(layer, MaxPool2d) else np.mean
            a = np.stack([np.stack([red(a[sh * h:sh * h + kh, sw * w:sw * w + kw], axis=(0, 1))
                                    for w in range(Wo)]) for h in range(Ho)])
        elif isinstance(layer, Flatten):
            a = a.reshape(-1)  # (h, w, c): flax's x.reshape((x.shape[0], -1)) on NHWC
    return a


def _flax_cnn_tree(model, theta):
    """The flax params of the CNN, built entry by entry: Conv kernels K[u, v, c, o] = W[o, c, u,
    v]; the Dense after a Flatten of a (C, H, W) map takes its input row (h, w, c) from refbayes'
    row (c, h, w); modules auto-named per class."""
    from refbayes.models import Conv2d, Flatten
    tree, n, flat, params = {}, {"Conv": 0, "Dense": 0}, None, iter(model.unflatten(theta))
    for k, layer in enumerate(model.layers):
        if isinstance(layer, Flatten):
            flat = model.shapes[k]
        if not hasattr(layer, "bias"):
            continue
        W, b = next(params)
        kind = "Conv" if isinstance(layer, Conv2d) else "Dense"
        if kind == "Conv":
            K = np.empty(W.shape[2:] + W.shape[1::-1])
            for o, c, u, v in np.ndindex(W.shape):
                K[u, v, c, o] = W[o, c, u, v]
        elif flat is not None:
            C, H, W_ = flat
            K = np.empty_like(W)
            for c, h, w in np.ndindex(C, H, W_):
                K[(h * W_ + w) * C + c] = W[(c * H + h) * W_ + w]
            flat = None
        else:
            K = W
        tree[f"{kind}_{n[kind]}"] = {"kernel": K} | ({"bias": b} if b is not None else {})
        n[kind] += 1
    return tree


@pytest.mark.parametrize("name", sorted(CNN_MODELS))
def test_flax_cnn_layout_is_a_network_that_computes_the_same_function(name):
    """The flax params of a CNN built by hand (_flax_cnn_tree), run by an NHWC forward written
    out here, give refbayes' outputs; their sorted-key ravel is from_refbayes(theta, "flax");
    to_layers gives their leaves in that order and from_layers inverts it."""
    model = CNN_MODELS[name]
    theta = _theta(model, seed=7)
    tree = _flax_cnn_tree(model, theta)
    X = np.random.default_rng(8).standard_normal((3,) + model.input_shape)
    f = np.stack([_nhwc_forward(model, tree, x) for x in X])
    assert_close(f, model.forward(theta, X), EXACT_F64, f"{name}: NHWC forward")
    np.testing.assert_array_equal(_ravel_sorted({"params": tree}),
                                  from_refbayes(theta, model, "flax"))
    leaves = [tree[m][leaf] for m in sorted(tree) for leaf in sorted(tree[m])]
    tensors = to_layers(theta, model, "flax")
    assert [t.shape for t in tensors] == [t.shape for t in leaves]
    for a, b in zip(tensors, leaves):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(from_layers(tensors, model, "flax"), theta)
    np.testing.assert_array_equal(to_refbayes(from_refbayes(theta, model, "flax"), model, "flax"),
                                  theta)


@pytest.mark.parametrize("name", sorted(CNN_MODELS))
def test_torch_cnn_layout_is_conv_blocks_as_they_are_and_linear_weights_transposed(name):
    model = CNN_MODELS[name]
    theta = _theta(model, seed=9)
    want = np.concatenate([part for W, b in model.unflatten(theta)
                           for part in ((W if W.ndim == 4 else W.T).ravel(),)
                           + ((b,) if b is not None else ())])
    np.testing.assert_array_equal(from_refbayes(theta, model, "torch"), want)
    np.testing.assert_array_equal(from_layers(to_layers(theta, model, "torch"), model, "torch"),
                                  theta)
    mine = to_layers(theta, model)
    want = [t for W, b in model.unflatten(theta) for t in (W, b) if t is not None]
    assert len(mine) == len(want)
    for a, b in zip(mine, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", sorted(CNN_MODELS))
def test_torch_cnn_network(name):
    """A real nn.Sequential of nn.Conv2d / nn.Linear: parameters_to_vector is
    from_refbayes(theta, "torch") and the forward passes agree."""
    torch = pytest.importorskip("torch")
    from torch.nn.utils import parameters_to_vector

    from refbayes.conformance.backpack import torch_cnn
    model = CNN_MODELS[name]
    net = torch_cnn(model)  # nn.Conv2d / nn.Linear / pooling / nn.Flatten, float64
    theta = _theta(model, seed=10)
    with torch.no_grad():
        for p, t in zip(net.parameters(), to_layers(theta, model, "torch")):
            assert tuple(p.shape) == t.shape
            p.copy_(torch.from_numpy(t))
    vec = parameters_to_vector(net.parameters()).detach().numpy()
    np.testing.assert_array_equal(vec, from_refbayes(theta, model, "torch"))
    np.testing.assert_array_equal(to_refbayes(vec, model, "torch"), theta)
    X = np.random.default_rng(11).standard_normal((4,) + model.input_shape)
    with torch.no_grad():
        f_torch = net(torch.from_numpy(X)).numpy()
    assert_close(model.forward(theta, X), f_torch, EXACT_F64, f"{name}: forward")


# ----------------------------------------------------------------------------- stacked blocks
# An axis of k D entries holding k theta-shaped blocks (BBB's [mu; rho], k = 2) converts block by
# block: a permutation still, each block permuted by p.

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_blocks_convert_each_block_and_round_trip(model, layout, k):
    rng = np.random.default_rng(5)
    D = model.D
    a = rng.standard_normal((4, k * D))
    b = from_refbayes(a, model, layout, blocks=k)
    for j in range(k):
        np.testing.assert_array_equal(b[:, j * D:(j + 1) * D],
                                      from_refbayes(a[:, j * D:(j + 1) * D], model, layout))
    np.testing.assert_array_equal(to_refbayes(b, model, layout, blocks=k), a)
    np.testing.assert_array_equal(from_refbayes(to_refbayes(a, model, layout, blocks=k), model,
                                                layout, blocks=k), a)
    q = permutation(model, layout, blocks=k)
    np.testing.assert_array_equal(np.sort(q), np.arange(k * D))
    np.testing.assert_array_equal(to_refbayes(a, model, layout, blocks=k), a[:, q])
    np.testing.assert_array_equal(q[:D], permutation(model, layout))


def test_blocks_per_axis_and_on_a_cnn():
    m = tiny_cnn()
    D = m.D
    rng = np.random.default_rng(6)
    a = rng.standard_normal((2 * D, D))  # [mu; rho] rows against theta columns
    b = from_refbayes(a, m, "flax", axes=(0, 1), blocks=(2, 1))
    p = np.argsort(permutation(m, "flax"))
    np.testing.assert_array_equal(b[:D], a[:D][p][:, p])
    np.testing.assert_array_equal(b[D:], a[D:][p][:, p])
    np.testing.assert_array_equal(to_refbayes(b, m, "flax", axes=(0, 1), blocks=(2, 1)), a)


def test_blocks_of_wrong_length_or_kind():
    m = MODELS["mlp-3-4-2"]
    D = m.D
    with pytest.raises(ValueError, match=rf"a: expected length blocks\[0\] \* D = 2 \* {D} = "
                                         rf"{2 * D} along axis 0"):
        to_refbayes(np.zeros(2 * D + 1), m, "torch", blocks=2)
    with pytest.raises(ValueError, match=rf"a: expected length D = {D} along axis 0"):
        to_refbayes(np.zeros(2 * D), m, "torch")  # k D is never inferred from the length
    with pytest.raises(ValueError, match=r"a: expected length blocks\[1\] \* D"):
        from_refbayes(np.zeros((D, D)), m, "torch", axes=(0, 1), blocks=(1, 2))
    for bad in (0, -1, True, 2.0, "2", None):
        with pytest.raises(ValueError, match="blocks: expected an int >= 1"):
            to_refbayes(np.zeros(D), m, "torch", blocks=bad)
        with pytest.raises(ValueError, match="blocks: expected an int >= 1"):
            permutation(m, "torch", blocks=bad)
    with pytest.raises(ValueError, match=r"blocks: expected an int >= 1 or one per axis \(2\)"):
        to_refbayes(np.zeros((D, D)), m, "torch", axes=(0, 1), blocks=(1,))
    with pytest.raises(ValueError, match="blocks: expected an int >= 1"):
        permutation(m, "torch", blocks=(2,))
