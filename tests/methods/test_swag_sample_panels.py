"""swag.sample on NumPy runs (swag.7) over row panels (a blocked D_hat^T w product, then one fused
elementwise pass): the draws must be bit for bit those of the whole-array form, for every panel
size, dtype, layout and buffer fill, and a non-finite draw in any panel must still be caught."""
from __future__ import annotations

import math

import numpy as np
import pytest

from refbayes.methods import swag


def _state(D, K, n, dtype, seed):
    rng = np.random.default_rng(seed)
    cfg = swag.SWAGConfig(K=K, scale=0.3, var_clamp=1e-6)
    state = swag.init(np.zeros(D, dtype), cfg)
    for i in range(n):
        state, _ = swag.collect(state, (rng.standard_normal(D) * (1 + i)).astype(dtype), cfg)
    return state, cfg


def _whole_array(state, z1, z2, cfg):
    """(swag.7) in the whole-array order of operations: c z1, + D_hat^T w, + theta_bar."""
    K = state.D_hat.shape[0]
    out = (math.sqrt(cfg.scale) * np.sqrt(np.maximum(
        state.theta2_bar - state.theta_bar * state.theta_bar, cfg.var_clamp)))[:, None] * z1
    if z2 is not None:
        Kp = min(state.n, K)
        w = np.zeros((K, z1.shape[1]), dtype=z2.dtype)
        w[[(state.n - Kp + j) % K for j in range(Kp)]] = z2 * math.sqrt(cfg.scale / (Kp - 1))
        out += state.D_hat.T @ w
    out += state.theta_bar[:, None]
    return out


@pytest.mark.parametrize("panel_bytes", [1, 5000, 1 << 20])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n", [2, 4, 11])
@pytest.mark.parametrize("order", ["C", "F"])
def test_panels_are_bit_identical_to_the_whole_array_form(monkeypatch, panel_bytes, dtype, n,
                                                          order):
    """Panels of 64 rows (the minimum), of a few hundred (a ragged last panel) and one panel;
    n < K (zero-weight ring rows), n > K (wrapped ring); SWAG and SWAG-Diagonal."""
    monkeypatch.setattr(swag, "SAMPLE_PANEL_BYTES", panel_bytes)
    D, K, S = 1001, 5, 7
    state, cfg = _state(D, K, n, dtype, seed=n)
    rng = np.random.default_rng(100 + n)
    z1 = np.asarray(rng.standard_normal((D, S)).astype(dtype), order=order)
    z2 = rng.standard_normal((min(n, K), S)).astype(dtype)
    for zz in (z2, None):
        got = swag.sample(state, z1, zz, cfg)
        want = _whole_array(state, z1, zz, cfg)
        assert got.dtype == want.dtype
        assert np.array_equal(got, want)  # checks (swag.7): same operations, same rounding


@pytest.mark.parametrize("low_rank", [True, False])
def test_a_non_finite_draw_in_a_late_panel_is_caught(monkeypatch, low_rank):
    monkeypatch.setattr(swag, "SAMPLE_PANEL_BYTES", 1)  # 64-row panels
    D, K, S = 500, 4, 3
    state, cfg = _state(D, K, 6, np.float64, seed=1)
    z1 = np.random.default_rng(2).standard_normal((D, S))
    z2 = np.random.default_rng(3).standard_normal((K, S)) if low_rank else None
    bad_z1 = z1.copy()
    bad_z1[D - 3, 1] = np.nan
    with pytest.raises(ValueError, match="z1"):
        swag.sample(state, bad_z1, z2, cfg)
    big = state._replace(theta2_bar=state.theta2_bar.copy())
    big.theta2_bar[D - 70] = 1e308  # a finite variance whose draw overflows
    z1[D - 70] = 1e160  # sqrt(0.3e308) 1e160 overflows float64
    with pytest.raises(ValueError, match="overflowed"):
        swag.sample(big, z1, z2, cfg)
