"""CNN.per_example_grads(out=...) and per_example_grads_batched(out=...): the contract (xp and
dtype of theta, shape (M, D) / (S, M, D), C-contiguous, out returned, values of out=None to the
bit, ValueError naming ``out`` otherwise); the chunked rows path against the one-pass blocks and
the loop reference; the NumPy numba kernels of unfold, fold and the max-pool argmax against the
generic slice code (autograd.numpy takes that path), bit for bit.

Equations: derivations/conv.md (conv.4), (conv.6)-(conv.7), (conv.9), (conv.11).
"""
import autograd.numpy as anp
import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.models import _conv_layers as cl
from refbayes.models import conv
from refbayes.models.conv import (CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d,
                                  lenet5, tiny_cnn)
from tests.reference import conv_loops as ref
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close


def _mixed():
    """Strides, padding, a rectangular kernel, overlapping pools, a no-bias conv, no-bias dense."""
    return CNN((2, 7, 8), [
        Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 2)), Activation("tanh"),
        AvgPool2d(2, stride=1),
        Conv2d(3, 2, 2, stride=(1, 2), bias=False), Activation("sigmoid"),
        MaxPool2d((2, 2), stride=(1, 2)), Flatten(),
        Dense(2 * 1 * 2, 4, bias=False), Activation("relu"), Dense(4, 2)], "gaussian")


def _batch(xp, model, M, dtype, seed=0):
    rng = np.random.default_rng(seed)
    theta = model.init_theta(rng, dtype=np.dtype(dtype))
    X = rng.standard_normal((M,) + model.input_shape).astype(dtype)
    if model.likelihood.name == "gaussian":
        y = rng.standard_normal((M, model.n_out)).astype(dtype)
    else:
        y = rng.integers(0, max(model.n_out, 2), M)
    return xp.asarray(theta), xp.asarray(X), xp.asarray(y)


MODELS = {"lenet5": lenet5, "tiny": tiny_cnn, "mixed": _mixed}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(MODELS))
def test_out_is_filled_returned_and_equal_to_no_out_bit_for_bit(xp, name, dtype):
    # checks (conv.6), (conv.7): the same rows written into a given array
    model = MODELS[name]()
    M = 23 if name == "lenet5" else 9   # LeNet-5: several NumPy chunks, the last one short
    theta, X, y = _batch(xp, model, M, dtype)
    G = model.per_example_grads(theta, X, y)
    out = xp.full((M, model.D), np.nan, dtype=dtype)
    got = model.per_example_grads(theta, X, y, out=out)
    assert got is out
    np.testing.assert_array_equal(to_numpy(out), to_numpy(G))
    big = xp.full((M + 5, model.D), np.nan, dtype=dtype)   # a row slice of a C-contiguous array
    assert model.per_example_grads(theta, X, y, out=big[2:2 + M]) is not None
    np.testing.assert_array_equal(to_numpy(big[2:2 + M]), to_numpy(G))
    assert np.isnan(to_numpy(big[:2])).all() and np.isnan(to_numpy(big[2 + M:])).all()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", ["lenet5", "mixed"])
def test_batched_out_equals_no_out_and_the_single_theta_rows(xp, name, dtype):
    # checks (conv.23): G[s] = per_example_grads(thetas[s]) to the bit, with and without out
    model = MODELS[name]()
    theta, X, y = _batch(xp, model, 6, dtype)
    thetas = xp.stack([theta, 0.5 * theta, -theta])
    G = model.per_example_grads_batched(thetas, X, y)
    out = xp.full((3, 6, model.D), np.nan, dtype=dtype)
    assert model.per_example_grads_batched(thetas, X, y, out=out) is out
    np.testing.assert_array_equal(to_numpy(out), to_numpy(G))
    for s in range(3):
        np.testing.assert_array_equal(to_numpy(G[s]), to_numpy(model.per_example_grads(thetas[s], X, y)))


def test_autograd_impl_fills_out():
    model = tiny_cnn()
    theta, X, y = _batch(np, model, 4, "float64")
    out = np.empty((4, model.D))
    assert model.per_example_grads(theta, X, y, impl="autograd", out=out) is out
    np.testing.assert_array_equal(out, model.per_example_grads(theta, X, y, impl="autograd"))


def _bad_outs(xp, M, D, dtype):
    other = "float32" if dtype == "float64" else "float64"
    wide = xp.zeros((M, D + 1), dtype=dtype)
    return {
        "dtype": xp.zeros((M, D), dtype=other),
        "rows": xp.zeros((M + 1, D), dtype=dtype),
        "cols": xp.zeros((M, D - 1), dtype=dtype),
        "ndim": xp.zeros((M * D,), dtype=dtype),
        "column slice": wide[:, 1:],
        "fortran": xp.asfortranarray(xp.zeros((M, D), dtype=dtype)),
        "list": [[0.0] * D] * M,
    }


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_bad_out_is_a_value_error_naming_out(xp, dtype):
    model = tiny_cnn()
    theta, X, y = _batch(xp, model, 3, dtype)
    for why, bad in _bad_outs(xp, 3, model.D, dtype).items():
        with pytest.raises(ValueError, match=r"^out: expected a C-contiguous"):
            model.per_example_grads(theta, X, y, out=bad)
        batched = bad if isinstance(bad, list) else bad[None]
        with pytest.raises(ValueError, match=r"^out: expected a C-contiguous"):
            model.per_example_grads_batched(xp.stack([theta]), X, y, out=batched)
    with pytest.raises(ValueError, match=r"^out: expected"):   # (M, D) where (S, M, D) is due
        model.per_example_grads_batched(xp.stack([theta]), X, y, out=xp.zeros((3, model.D), dtype))


def test_numpy_out_with_cupy_theta_is_refused():
    cupy = pytest.importorskip("cupy")
    model = tiny_cnn()
    theta, X, y = _batch(cupy, model, 3, "float64")
    with pytest.raises(ValueError, match=r"^out: expected a C-contiguous CuPy"):
        model.per_example_grads(theta, X, y, out=np.zeros((3, model.D)))


@pytest.mark.parametrize("chunk_bytes", [1, 10 ** 5])
def test_chunked_rows_match_the_one_pass_blocks_and_the_loop_reference(monkeypatch, chunk_bytes):
    # checks (conv.6), (conv.7): chunks of 1 example and of a few, against the unchunked blocks
    model = lenet5()
    theta, X, y = _batch(np, model, 7, "float64", seed=3)
    one_pass = np.concatenate(model._gradient_blocks(np, theta, X, y, "rows"), axis=1)
    monkeypatch.setattr(conv, "_ROWS_CHUNK_BYTES", chunk_bytes)
    G = model.per_example_grads(theta, X, y)
    assert_close(G, one_pass, EXACT_F64, "chunked rows vs one-pass blocks")
    small = _mixed()
    theta, X, y = _batch(np, small, 5, "float64", seed=4)
    want = ref.per_example_grads_loop(ref.LoopSpec(small), theta, X, y)
    assert_close(small.per_example_grads(theta, X, y), want, EXACT_F64, "chunked rows vs loop network")


def test_float32_rows_match_float64():
    model = lenet5()
    theta, X, y = _batch(np, model, 5, "float64", seed=5)
    G32 = model.per_example_grads(theta.astype(np.float32), X.astype(np.float32), y)
    assert G32.dtype == np.float32
    assert_close(G32, model.per_example_grads(theta, X, y), EXACT_F32, "float32 rows")


# ---------------------------------------------------------------------------- numba kernels

@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("k, s", [((5, 5), (1, 1)), ((3, 2), (2, 1)), ((2, 2), (2, 2)), ((2, 3), (1, 2))])
def test_numba_unfold_fold_and_pool_equal_the_slice_code(dtype, k, s):
    # checks (conv.4), (conv.9), (conv.11): NumPy's numba loops against the generic strided slices
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 2, 9, 8)).astype(dtype)
    x[0, 0, :4] = 0.0                       # ties: the first maximum wins
    x[1, 1] = np.maximum(x[1, 1], 0.0)      # relu-like zeros
    U = cl.unfold(np, x, k[0], k[1], s[0], s[1])
    assert U.dtype == np.dtype(dtype) and U.flags.c_contiguous
    np.testing.assert_array_equal(U, cl.unfold(anp, x, k[0], k[1], s[0], s[1]))
    P = cl.windows(np, x, k[0], k[1], s[0], s[1])
    V = rng.standard_normal(P.shape).astype(dtype)
    want = np.zeros(x.shape, dtype)        # fold's slice adds, in its order
    for u in range(k[0]):
        for v in range(k[1]):
            want[:, :, u:u + s[0] * (P.shape[3] - 1) + 1:s[0],
                 v:v + s[1] * (P.shape[4] - 1) + 1:s[1]] += V[:, :, u * k[1] + v]
    np.testing.assert_array_equal(cl.fold(np, V, x.shape, k[0], k[1], s[0], s[1]), want)
    onehot, y = cl.max_pool(np, x, k, s)
    onehot_g, y_g = cl.max_pool(anp, x, k, s)
    np.testing.assert_array_equal(onehot, onehot_g)
    np.testing.assert_array_equal(y, y_g)
    assert y.dtype == np.dtype(dtype) and onehot.dtype == np.bool_


def test_numba_pool_argmax_takes_the_first_nan_as_numpy():
    x = np.zeros((1, 1, 2, 4))
    x[0, 0, 1, 0] = np.nan                  # window 0: NaN after a larger-or-equal value
    x[0, 0, 0, 2], x[0, 0, 1, 3] = 5.0, np.nan
    onehot, y = cl.max_pool(np, x, (2, 2), (2, 2))
    onehot_g, _ = cl.max_pool(anp, x, (2, 2), (2, 2))
    np.testing.assert_array_equal(onehot, onehot_g)
    assert np.isnan(y).all()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("k, s", [((2, 2), (2, 2)), ((2, 2), (1, 2)), ((3, 2), (2, 1))])
def test_numba_max_pool_backward_equals_the_fold_of_the_routed_errors(dtype, k, s):
    # checks (conv.12): one loop against fold(onehot * dy), bit for bit (overlapping windows too)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 2, 9, 8)).astype(dtype)
    onehot, y = cl.max_pool(np, x, k, s)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dy[0, 0] = -dy[0, 0]
    got = cl.max_pool_backward(np, onehot, dy, x.shape, k, s)
    want = cl.fold(np, onehot * dy[:, :, None], x.shape, k[0], k[1], s[0], s[1])
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
