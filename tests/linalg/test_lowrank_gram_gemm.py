"""The row-blocked Gram sum U^T diag(d)^{-1} U of lowrank (the capacitance's term of (lowrank.2))
takes each block's V_b^T V_b from BLAS gemm rather than the syrk NumPy's matmul picks for a
product with its own transpose: it must still be the dense Gram matrix, exactly symmetric (the
Cholesky and eigh read one triangle), for every L, dtype, layout of U and block split."""
from __future__ import annotations

import numpy as np
import pytest

from refbayes.linalg import lowrank
from tests.tolerances import EXACT_F32, EXACT_F64, rel_err


@pytest.mark.parametrize("rows", [5, 64, 8192])
@pytest.mark.parametrize("L", [1, 2, 10, 32])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("order", ["C", "F"])
def test_gemm_gram_is_the_dense_gram_and_symmetric(monkeypatch, rows, L, dtype, order):
    monkeypatch.setattr(lowrank, "_ROWS_PER_BLOCK", rows)
    rng = np.random.default_rng(L * 100 + rows)
    D = 333  # a last partial block for every split above but one block at 8192
    U64 = rng.standard_normal((D, L))
    d64 = rng.uniform(0.1, 10, D)
    U = np.asarray(U64.astype(dtype), order=order)
    d = d64.astype(dtype)
    got = lowrank._weighted_gram(U, d)
    Uw = U.astype(np.float64)
    dense = Uw.T @ (Uw / d.astype(np.float64)[:, None])  # checks (lowrank.2): the Gram term
    assert got.dtype == dtype
    assert np.array_equal(got, got.T)
    assert rel_err(got, dense) < (EXACT_F64 if dtype == np.float64 else EXACT_F32)


def test_capacitance_of_the_gemm_gram_solves_like_the_dense_precision():
    rng = np.random.default_rng(7)
    D, L = 20_000, 10  # three blocks of 8192 rows, the last partial
    U = rng.standard_normal((D, L)) / np.sqrt(D)
    d = rng.uniform(0.5, 2.0, D)
    g = rng.standard_normal(D)
    z = lowrank.solve(U, d, g)
    # P z = g, with P applied by (lowrank.1): the solve of (lowrank.3) through the new Gram sum
    assert rel_err(U @ (U.T @ z) + d * z, g) < EXACT_F64  # checks (lowrank.3)
