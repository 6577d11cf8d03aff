"""The shared input checks of refbayes._checks: NaN and inf never pass a range check unless an
infinite bound is explicitly allowed (a closed bracket at +-inf), and every message names the
argument (issue 9, items 4 and 5)."""
import math

import numpy as np
import pytest

from refbayes import _checks as C

NAN, INF = float("nan"), float("inf")


# ----------------------------------------------------------------------------- check_in_range

@pytest.mark.parametrize("x", [NAN, np.float64(NAN), np.float32(NAN)], ids=["float", "f64", "f32"])
@pytest.mark.parametrize("low, high, low_open, high_open", [
    (0.0, 1.0, True, False),        # (0, 1]
    (0.0, 1.0, False, True),        # [0, 1)
    (0.0, math.inf, True, True),    # (0, inf)
    (0.0, math.inf, False, False),  # [0, inf]: inf allowed, NaN still not
    (-math.inf, math.inf, False, False),  # the whole extended line: NaN still not
], ids=["(0,1]", "[0,1)", "(0,inf)", "[0,inf]", "[-inf,inf]"])
def test_in_range_rejects_nan(x, low, high, low_open, high_open):
    with pytest.raises(ValueError, match=r"cfg\.alpha: expected a finite real number in .*, got nan"):
        C.check_in_range(x, "cfg.alpha", low, high, low_open=low_open, high_open=high_open)


@pytest.mark.parametrize("x", [INF, -INF, np.float64(INF)], ids=["inf", "-inf", "f64-inf"])
@pytest.mark.parametrize("low, high, low_open, high_open", [
    (0.0, 1.0, True, False),
    (0.0, math.inf, True, True),
    (0.0, math.inf, False, True),
    (-math.inf, math.inf, True, True),
], ids=["(0,1]", "(0,inf)", "[0,inf)", "(-inf,inf)"])
def test_in_range_rejects_inf_unless_allowed(x, low, high, low_open, high_open):
    with pytest.raises(ValueError, match=r"decay: expected a finite real number in .*, got -?inf"):
        C.check_in_range(x, "decay", low, high, low_open=low_open, high_open=high_open)


def test_in_range_allows_inf_at_a_closed_infinite_bound():
    assert C.check_in_range(INF, "damping", 0.0, math.inf) == INF
    assert C.check_in_range(-INF, "shift", -math.inf, 0.0) == -INF
    with pytest.raises(ValueError, match=r"shift: expected a finite real number in \[-inf, 0.0\], got inf"):
        C.check_in_range(INF, "shift", -math.inf, 0.0)


@pytest.mark.parametrize("x, ok", [
    (0.0, False), (1e-300, True), (1.0, True), (1.0000001, False), (-1.0, False),
    (np.float32(0.5), True), (1, True),
])
def test_in_range_finite_values(x, ok):
    """The finite cases keep their old behaviour and message."""
    if ok:
        assert C.check_in_range(x, "alpha", 0.0, 1.0, low_open=True) == float(x)
        assert type(C.check_in_range(x, "alpha", 0.0, 1.0, low_open=True)) is float
    else:
        with pytest.raises(ValueError, match=r"alpha: expected a value in \(0.0, 1.0\], got"):
            C.check_in_range(x, "alpha", 0.0, 1.0, low_open=True)


@pytest.mark.parametrize("x", [True, "0.5", None, np.array(0.5), 1j])
def test_in_range_rejects_non_reals(x):
    with pytest.raises(ValueError, match="beta: expected a real number"):
        C.check_in_range(x, "beta", 0.0, 1.0)


# ----------------------------------------------------------------------------- check_positive

@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("a", [
    NAN, np.float64(NAN), np.array([1.0, NAN, 2.0]), np.array([NAN]),
], ids=["float", "f64", "array", "all-nan"])
def test_positive_rejects_nan(a, strict):
    with pytest.raises(ValueError, match=r"lam: expected (> 0|>= 0) everywhere.*got NaN"):
        C.check_positive(a, "lam", strict=strict)


@pytest.mark.parametrize("a", [INF, np.array([1.0, INF]), -INF, np.array([-INF, 1.0])],
                         ids=["inf", "array-inf", "-inf", "array--inf"])
def test_positive_rejects_inf(a):
    with pytest.raises(ValueError, match=r"d: expected finite values > 0.*got.*inf"):
        C.check_positive(a, "d")


@pytest.mark.parametrize("a, strict, ok", [
    (np.array([1.0, 2.0]), True, True),
    (np.array([0.0, 2.0]), True, False),
    (np.array([0.0, 2.0]), False, True),
    (np.array([-1e-300, 2.0]), False, False),
    (0.5, True, True),
    (0.0, True, False),
    (0.0, False, True),
    (np.zeros(0), True, True),
])
def test_positive_finite_values(a, strict, ok):
    if ok:
        assert C.check_positive(a, "var", strict=strict) is a
    else:
        with pytest.raises(ValueError, match=rf"var: expected {'> 0' if strict else '>= 0'} "
                                             r"everywhere, got min"):
            C.check_positive(a, "var", strict=strict)


# ----------------------------------------------------------------------------- reciprocals, symmetry

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_reciprocal_rejects_subnormal_entries(dtype):
    tiny = np.finfo(dtype).tiny
    ok = np.array([tiny, 1.0, np.finfo(dtype).max], dtype=dtype)
    assert C.check_invertible_positive(ok, "d") is ok
    assert np.all(np.isfinite(1 / ok))
    bad = np.array([tiny / 4, 1.0], dtype=dtype)  # subnormal: 1 / bad overflows
    with np.errstate(over="ignore"):
        assert not np.all(np.isfinite(1 / bad))
    with pytest.raises(ValueError, match=r"d: expected entries >= .* \(the smallest normal "
                                         rf"{np.dtype(dtype).name}\).*got min"):
        C.check_invertible_positive(bad, "d")
    with pytest.raises(ValueError, match=r"d: expected > 0 everywhere"):
        C.check_invertible_positive(np.array([0.0, 1.0], dtype=dtype), "d")
    with pytest.raises(ValueError, match=r"d: expected (> 0 everywhere|finite).*NaN"):
        C.check_invertible_positive(np.array([NAN, 1.0], dtype=dtype), "d")


def test_symmetric_uses_the_spd_rule():
    """check_symmetric and check_spd share one rule: max|M - M^T| <= 100 eps max|M|."""
    M = np.array([[2.0, 1.0], [1.0, 2.0]])
    assert C.check_symmetric(M, "Sigma_inv") is M
    near = M.copy()
    near[0, 1] += 50 * np.finfo(float).eps * 2.0  # inside the bound
    C.check_symmetric(near, "Sigma_inv")
    C.check_spd(near, "Sigma_inv")
    far = M.copy()
    far[0, 1] += 1e-6
    with pytest.raises(ValueError, match=r"Sigma_inv: expected a symmetric matrix, got "
                                         r"max\|M - M\^T\| = 1.000e-06"):
        C.check_symmetric(far, "Sigma_inv")
    with pytest.raises(ValueError, match=r"Sigma_inv: expected a symmetric matrix"):
        C.check_spd(far, "Sigma_inv")
    with pytest.raises(ValueError, match=r"P: expected a square matrix, got shape \(2, 3\)"):
        C.check_symmetric(np.zeros((2, 3)), "P")
    with pytest.raises(ValueError, match=r"P: expected finite values"):
        C.check_symmetric(np.full((2, 2), NAN), "P")


def test_in_range_huge_integer_is_treated_as_infinite():
    """float(10**400) overflows: the check reports it instead of raising OverflowError."""
    with pytest.raises(ValueError, match=r"n: expected a finite real number in \[0.0, inf\)"):
        C.check_in_range(10**400, "n", 0.0, math.inf, high_open=True)
    with pytest.raises(ValueError, match=r"n: expected finite values > 0"):
        C.check_positive(10**400, "n")


def test_unchecked_skips_value_scans_but_not_structure():
    import numpy as np

    import refbayes
    from refbayes._checks import check_array, check_positive, value_checks
    bad = np.array([1.0, np.nan])
    with pytest.raises(ValueError, match="x: expected finite values"):
        check_array(bad, "x")
    with refbayes.unchecked():
        assert not value_checks()
        assert check_array(bad, "x") is bad            # the O(size) scan is skipped
        assert check_positive(-np.ones(2), "p") is not None
        with pytest.raises(ValueError, match="x: expected shape .3."):
            check_array(bad, "x", shape=(3,))        # the O(1) checks still run
        with pytest.raises(ValueError, match="n: expected an integer"):
            from refbayes._checks import check_int
            check_int(0.5, "n")
    assert value_checks()                             # restored on exit
    with pytest.raises(RuntimeError):
        with refbayes.unchecked():
            raise RuntimeError
    assert value_checks()                             # restored on an exception too


def test_the_driver_skips_the_scans_after_its_first_step_with_the_same_results():
    """driver.run (first step checked, then refbayes.unchecked) equals the same steps taken
    one by one with every check, bit for bit."""
    import numpy as np

    from refbayes.datasets import make_logistic_regression
    from refbayes.methods import driver, slang
    from refbayes.methods._estimates import Batch
    from refbayes.models import LogisticRegression
    X, y, _ = make_logistic_regression(40, 5, 0)
    model = LogisticRegression(5)
    D = model.D
    state = slang.init(np.zeros(D), 0.1 * np.ones((D, 2)), np.ones(D))
    cfg = slang.SLANGConfig(N=40, lam=np.ones(D), L=2)
    got = driver.run(state, cfg, model, X, y, rng=np.random.default_rng(1), epochs=3, M=8, S=2)
    rng = np.random.default_rng(1)
    ref = state
    for _ in range(3):
        for idx in driver.epoch_batches(rng, 40, 8):
            eps = rng.standard_normal((D, 2))
            ref, _ = slang.step(ref, Batch(X[idx], y[idx]), eps, cfg, model)
    for field in ("mu", "U", "d", "g_bar"):
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field))


def test_the_driver_still_checks_its_data_whole():
    import numpy as np

    from refbayes.datasets import make_logistic_regression
    from refbayes.methods import driver, vogn
    from refbayes.models import LogisticRegression
    X, y, _ = make_logistic_regression(40, 5, 0)
    y = y.astype(float)
    y[-1] = np.nan  # a row no first minibatch may contain
    model = LogisticRegression(5)
    state = vogn.init(np.zeros(model.D), np.ones(model.D))
    with pytest.raises(ValueError, match="y: expected finite values"):
        driver.run(state, vogn.VOGNConfig(40, delta=1.0), model, X, y,
                   rng=np.random.default_rng(0), epochs=1, M=8)


@pytest.mark.parametrize("label", [2.0, 0.5, -1.0])
def test_the_driver_checks_every_label_once_and_the_steps_skip_the_label_scans(label):
    """A classifier's labels are checked whole by driver.run (a bad one anywhere is refused
    before any step), so the per-minibatch label scans can be skipped inside unchecked()."""
    import numpy as np

    import refbayes
    from refbayes.datasets import make_logistic_regression
    from refbayes.methods import driver, vogn
    from refbayes.models import LogisticRegression
    X, y, _ = make_logistic_regression(40, 5, 0)
    y = y.astype(float)
    y[-1] = label
    model = LogisticRegression(5)
    state = vogn.init(np.zeros(model.D), np.ones(model.D))
    with pytest.raises(ValueError, match=r"y: expected (integer class )?labels in \{0, ..., 1\}"):
        driver.run(state, vogn.VOGNConfig(40, delta=1.0), model, X, y,
                   rng=np.random.default_rng(0), epochs=1, M=8)
    f = np.zeros((1, 1))
    with pytest.raises(ValueError, match="labels"):
        model.likelihood.losses(f, y[-1:])
    with refbayes.unchecked():  # the scan is skipped, the shape check is not
        model.likelihood.losses(f, y[-1:])
        with pytest.raises(ValueError, match=r"y: expected shape \(1\), got \(2,\)"):
            model.likelihood.losses(f, y[-2:])


# ----------------------------------------------------------------------------- check_int

@pytest.mark.parametrize("n, low, high, message", [
    (0, 1, None, "n: expected an integer in [1, inf), got 0"),
    (-1, 0, None, "n: expected an integer in [0, inf), got -1"),
    (6, None, 5, "n: expected an integer in (-inf, 5], got 6"),
    (7, 1, 6, "n: expected an integer in [1, 6], got 7"),
    (0, 1, 6, "n: expected an integer in [1, 6], got 0"),
])
def test_check_int_prints_an_unbounded_end_as_inf(n, low, high, message):
    """An unbounded end reads [1, inf), not [1, None] (issue 35, item 3)."""
    with pytest.raises(ValueError) as err:
        C.check_int(n, "n", low=low, high=high)
    assert str(err.value) == message


def test_check_int_without_bounds_takes_every_integer():
    assert C.check_int(-10**30, "n") == -10**30 and C.check_int(np.int64(3), "n", low=3) == 3
