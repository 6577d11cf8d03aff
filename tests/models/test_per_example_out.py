"""``out=`` of per_example_grads, per_example_grads_batched and the _estimates wrapper (issue 37).

The contract: ``out`` is an array of theta's backend and dtype, of exactly the result's shape,
C-contiguous (a row slice of a C-contiguous 2-d array such as SLANG's ``W_T[L:]`` qualifies); the
rows are written into it, bit for bit the values of ``out=None``, and ``out`` itself is returned.
Anything else is a ValueError naming ``out`` (no silent copy, no broadcast).
"""
import numpy as np
import pytest

from refbayes.backend import cupy_available, to_numpy
from refbayes.methods._estimates import per_example_grads as estimates_per_example_grads
from tests.models.cases import CASES, batch, ids

DTYPES = [np.float64, np.float32]
NUMPY_IMPLS = ["numba", "vectorized", "autograd"]
PAD = 3  # rows of the larger buffer above the slice that receives G


def _buffer(xp, M, D, dtype):
    """A C-contiguous (PAD + M, D) buffer filled with NaN and its row slice [PAD:] of (M, D)."""
    buf = xp.full((PAD + M, D), xp.nan, dtype=dtype)
    return buf, buf[PAD:]


@pytest.mark.parametrize("impl", NUMPY_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_out_is_bit_identical_and_returned_numpy_impls(case, dtype, impl):
    theta, X, y = batch(case, dtype)
    model = case.model
    want = model.per_example_grads(theta, X, y, impl=impl)
    buf, out = _buffer(np, case.M, model.D, dtype)
    got = model.per_example_grads(theta, X, y, impl=impl, out=out)
    assert got is out
    assert np.array_equal(out, want)  # bit for bit, not to rounding
    assert np.isnan(buf[:PAD]).all()  # nothing written outside the slice


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_out_vectorized_both_backends(case, dtype, xp):
    theta, X, y = batch(case, dtype, xp)
    model = case.model
    want = model.per_example_grads(theta, X, y, impl="vectorized")
    buf, out = _buffer(xp, case.M, model.D, dtype)
    got = model.per_example_grads(theta, X, y, impl="vectorized", out=out)
    assert got is out
    assert np.array_equal(to_numpy(out), to_numpy(want))
    assert np.isnan(to_numpy(buf[:PAD])).all()
    if xp is not np:  # the default impl on CuPy is the vectorized one
        assert model.per_example_grads(theta, X, y, out=out) is out
        assert np.array_equal(to_numpy(out), to_numpy(want))


@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_out_batched_both_backends(case, dtype, S, xp):
    _, X, y = batch(case, dtype, xp)
    model = case.model
    thetas = xp.asarray((0.6 * np.random.default_rng(1).standard_normal((S, model.D))).astype(dtype))
    want = model.per_example_grads_batched(thetas, X, y)
    buf = xp.full((PAD + S * case.M, model.D), xp.nan, dtype=dtype)
    out = buf[PAD:].reshape(S, case.M, model.D)
    got = model.per_example_grads_batched(thetas, X, y, out=out)
    assert got is out
    assert np.array_equal(to_numpy(out), to_numpy(want))
    assert np.isnan(to_numpy(buf[:PAD])).all()


@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("case", CASES[:2] + CASES[-3:], ids=ids(CASES[:2] + CASES[-3:]))
def test_estimates_wrapper_passes_out_through(case, S, xp):
    _, X, y = batch(case, np.float64, xp)
    model = case.model
    theta = xp.asarray(0.6 * np.random.default_rng(2).standard_normal((model.D, S)))  # (D, S)
    want = estimates_per_example_grads(model, theta, X, y)
    L = 2  # the rows of SLANG's W^T below its first L
    W_T = xp.full((L + S * case.M, model.D), xp.nan)
    out = W_T[L:].reshape(S, case.M, model.D)
    got = estimates_per_example_grads(model, theta, X, y, out=out)
    assert got is out and got.shape == (S, case.M, model.D)
    assert np.array_equal(to_numpy(out), to_numpy(want))
    assert np.isnan(to_numpy(W_T[:L])).all()


def _bad_outs(xp, M, D, dtype):
    other = np.float32 if dtype == np.float64 else np.float64
    return {
        "dtype": xp.empty((M, D), dtype=other),
        "rows": xp.empty((M + 1, D), dtype=dtype),
        "columns": xp.empty((M, D + 1), dtype=dtype),
        "1-d": xp.empty(M * D, dtype=dtype),
        "broadcastable (1, D)": xp.empty((1, D), dtype=dtype),
        "transposed (F-ordered)": xp.empty((D, M), dtype=dtype).T,
        "column slice": xp.empty((M, D + 2), dtype=dtype)[:, 1:D + 1],
        "list": [[0.0] * D] * M,
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_bad_out_raises_naming_out(dtype, xp):
    case = CASES[-1]
    theta, X, y = batch(case, dtype, xp)
    model = case.model
    impls = NUMPY_IMPLS if xp is np else ["vectorized"]
    for out in _bad_outs(xp, case.M, model.D, dtype).values():
        for impl in impls:
            with pytest.raises(ValueError, match=r"^out: expected a C-contiguous"):
                model.per_example_grads(theta, X, y, impl=impl, out=out)
        with pytest.raises(ValueError, match=r"^out: expected"):
            model.per_example_grads_batched(theta[None], X, y, out=out)
        with pytest.raises(ValueError, match=r"^out: expected"):
            estimates_per_example_grads(model, theta[:, None], X, y, out=out)


def test_read_only_and_other_backend_outs_raise():
    case = CASES[-1]
    theta, X, y = batch(case)
    model = case.model
    ro = np.empty((case.M, model.D))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: expected .* writeable; got a read-only array"):
        model.per_example_grads(theta, X, y, out=ro)
    with pytest.raises(ValueError, match=r"^out: expected a C-contiguous NumPy array .* got "):
        model.per_example_grads(theta, X, y, out=(0.0,) * model.D)


def test_batched_out_shape_is_exact():
    case = CASES[-1]
    _, X, y = batch(case)
    model = case.model
    thetas = np.zeros((2, model.D))
    for shape in [(2 * case.M, model.D), (1, case.M, model.D), (2, case.M, model.D, 1)]:
        with pytest.raises(ValueError, match=r"^out: expected .* shape \(2, 9, "):
            model.per_example_grads_batched(thetas, X, y, out=np.empty(shape))


@pytest.mark.gpu
def test_numpy_out_with_cupy_inputs_raises():
    cupy = pytest.importorskip("cupy")
    if not cupy_available():
        pytest.skip("CuPy with a CUDA device is not available")
    case = CASES[-1]
    theta, X, y = batch(case, np.float64, cupy)
    with pytest.raises(ValueError, match=r"^out: expected a C-contiguous CuPy array"):
        case.model.per_example_grads(theta, X, y, out=np.empty((case.M, case.model.D)))
    with pytest.raises(ValueError, match=r"^out: expected a C-contiguous NumPy array"):
        case.model.per_example_grads(to_numpy(theta), to_numpy(X), to_numpy(y),
                                     out=cupy.empty((case.M, case.model.D)))
