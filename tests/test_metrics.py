"""refbayes.metrics against hand computations and, where it has the metric, scikit-learn (a test-only
dependency, skipped without it)."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refbayes import metrics
from refbayes.backend import cupy_available

P = np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
Y = np.array([0, 0, 1, 1])


def test_nll_accuracy_brier_by_hand():
    assert metrics.nll(P, Y) == pytest.approx(-(math.log(0.9) + math.log(0.3) + math.log(0.4)
                                                + math.log(0.8)) / 4, rel=1e-14)
    assert metrics.accuracy(P, Y) == 0.5  # rows 0 and 3 right
    # (0.1^2 + 0.1^2) + (0.7^2 + 0.7^2) + (0.6^2 + 0.6^2) + (0.2^2 + 0.2^2), over 4
    assert metrics.brier(P, Y) == pytest.approx((0.02 + 0.98 + 0.72 + 0.08) / 4, rel=1e-14)


def test_ece_and_mce_by_hand():
    # confidences 0.9, 0.7, 0.6, 0.8 fall in bins 9, 7, 6, 8 (one each) with correctness
    # 1, 0, 0, 1: gaps 0.1, 0.7, 0.6, 0.2, each weighted 1/4
    ece, mce = metrics.calibration_errors(P, Y, n_bins=10)
    assert ece == pytest.approx((0.1 + 0.7 + 0.6 + 0.2) / 4, rel=1e-12)
    assert mce == pytest.approx(0.7, rel=1e-12)
    # two bins: [0.5, 1) holds all four, mean confidence 0.75, accuracy 0.5
    assert metrics.ece(P, Y, n_bins=2) == pytest.approx(0.25, rel=1e-12)
    assert metrics.mce(P, Y, n_bins=2) == pytest.approx(0.25, rel=1e-12)
    # a confidence of exactly 1 goes in the last bin and one on the edge 0.5 starts the bin
    # above it, so both rows share bin [0.5, 1]: accuracy 1/2 (the tie predicts class 0),
    # confidence 3/4, gap 1/4 (MCE would be 1/2 if 0.5 fell in the bin below)
    Q = np.array([[1.0, 0.0], [0.5, 0.5]])
    assert metrics.calibration_errors(Q, np.array([0, 1]), n_bins=2) == (0.25, 0.25)


def test_regression_metrics_by_hand():
    y = np.array([0.0, 1.0])
    assert metrics.rmse(np.array([1.0, 1.0]), y) == pytest.approx(math.sqrt(0.5))
    assert metrics.gaussian_nll(np.array([0.0, 0.0]), np.array([1.0, 4.0]), y) == pytest.approx(
        (0.5 * math.log(2 * math.pi) + 0.5 * math.log(2 * math.pi * 4) + 0.5 / 4) / 2)
    # one sample: the mixture is the Gaussian; two samples: log of the average density
    F = np.array([[0.0, 0.0], [2.0, 1.0]])
    assert metrics.mixture_gaussian_nll(F[:1], 1.0, y) == pytest.approx(
        metrics.gaussian_nll(F[0], np.ones(2), y))
    dens = lambda r: math.exp(-0.5 * r * r) / math.sqrt(2 * math.pi)  # noqa: E731
    expected = -(math.log((dens(0.0) + dens(2.0)) / 2) + math.log((dens(1.0) + dens(0.0)) / 2)) / 2
    assert metrics.mixture_gaussian_nll(F, 1.0, y) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("probs, y, match", [
    (np.array([[0.5, 0.6]]), np.array([0]), "summing to 1"),
    (np.array([0.5, 0.5]), np.array([0]), "expected shape \\(M, C\\)"),
    (P, np.array([0, 1, 2, 0]), "labels in"),
    (P, np.array([0.0, 1.0, 1.0, 0.0]), "integer labels"),
    (P, Y[:3], "expected shape \\(4,\\)"),
])
def test_bad_inputs_are_named(probs, y, match):
    with pytest.raises(ValueError, match=match):
        metrics.nll(probs, y)


def test_bad_bins_and_variances():
    with pytest.raises(ValueError, match="n_bins"):
        metrics.ece(P, Y, n_bins=0)
    with pytest.raises(ValueError, match="var"):
        metrics.gaussian_nll(np.zeros(2), np.array([1.0, 0.0]), np.zeros(2))
    with pytest.raises(ValueError, match="noise_var"):
        metrics.mixture_gaussian_nll(np.zeros((1, 2)), 0.0, np.zeros(2))


# --- predictive entropy, AUROC, reliability curve -------------------------------------------

def test_predictive_entropy_by_hand():
    probs = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    H = metrics.predictive_entropy(probs)
    assert H.shape == (4,) and H.dtype == np.float64
    # one-hot: 1 log 1 + 0 log 0 + 0 log 0 = 0 exactly (0 log 0 = 0, no epsilon, no warning:
    # pyproject turns RuntimeWarnings such as log(0) into errors)
    assert H[0] == 0.0
    # -(2 * 0.5 log 0.5) = log 2; -(2 * 0.25 log 0.25 + 0.5 log 0.5) = 0.5 * 2 log 2 + 0.5 log 2
    # = 1.5 log 2; the uniform row: log 3
    np.testing.assert_allclose(H[1:], [math.log(2), 1.5 * math.log(2), math.log(3)], rtol=1e-14)


def test_auroc_by_hand():
    # positives score 0.35, 0.8; negatives 0.1, 0.4. Pairs (pos > neg): 0.35 > 0.1 yes,
    # 0.35 > 0.4 no, 0.8 > 0.1 yes, 0.8 > 0.4 yes: 3 of 4
    assert metrics.auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    # with a tie: positives 0.5, 0.9; negatives 0.5, 0.2. Pairs: (0.5, 0.5) tie 1/2,
    # (0.5, 0.2) 1, (0.9, 0.5) 1, (0.9, 0.2) 1: 3.5 / 4
    scores, labels = np.array([0.5, 0.5, 0.2, 0.9]), np.array([1, 0, 0, 1])
    assert metrics.auroc(scores, labels) == 0.875
    # swapping the classes (or negating the scores) gives 1 - AUROC; bool labels work too
    assert metrics.auroc(scores, 1 - labels) == 0.125
    assert metrics.auroc(-scores, labels.astype(bool)) == 0.125
    # perfect separation, and all scores tied (every pair 1/2); integer scores are ranked as is
    assert metrics.auroc([0, 1, 2, 3], [0, 0, 1, 1]) == 1.0
    assert metrics.auroc(np.ones(5), [0, 1, 0, 1, 1]) == 0.5


def test_misclassification_auroc_by_hand():
    # rows 0-2 are correct (argmax = y) with confidences 0.9, 0.7, 0.6; rows 3-4 are wrong with
    # confidences 0.7, 0.55. The binary entropy falls as the confidence rises, so the score -H
    # ranks rows like their confidence; rows 1 and 3 hold the same two numbers, so their entropies
    # are equal. Pairs (correct, wrong) with the correct one more confident: (0.9, 0.7) 1,
    # (0.9, 0.55) 1, (0.7, 0.7) tie 1/2, (0.7, 0.55) 1, (0.6, 0.7) 0, (0.6, 0.55) 1: 4.5 / 6
    probs = np.array([[0.9, 0.1], [0.3, 0.7], [0.6, 0.4], [0.7, 0.3], [0.45, 0.55]])
    y = np.array([0, 1, 0, 1, 0])
    assert metrics.misclassification_auroc(probs, y) == 0.75
    # P, Y: correct rows have confidences 0.9, 0.8, wrong ones 0.7, 0.6: perfectly separated
    assert metrics.misclassification_auroc(P, Y) == 1.0


def test_ood_auroc_by_hand():
    # entropies: in-distribution 0 (one-hot) and log 2 (uniform); out-of-distribution log 2 and
    # H(0.8, 0.2) = 0.500 < log 2 = 0.693. Pairs (out > in): (log 2, 0) 1, (log 2, log 2) tie 1/2,
    # (H(0.8), 0) 1, (H(0.8), log 2) 0: 2.5 / 4
    probs_in = np.array([[1.0, 0.0], [0.5, 0.5]])
    probs_out = np.array([[0.5, 0.5], [0.8, 0.2]])
    assert metrics.ood_auroc(probs_in, probs_out) == 0.625
    # the arguments swapped: the complement
    assert metrics.ood_auroc(probs_out, probs_in) == 0.375


def test_reliability_curve_by_hand():
    # four bins [0, .25), [.25, .5), [.5, .75), [.75, 1]: confidences 0.7, 0.6 (both wrong) in
    # bin 2, 0.9, 0.8 (both right) in bin 3; bins 0 and 1 are empty
    curve = metrics.reliability_curve(P, Y, n_bins=4)
    np.testing.assert_array_equal(curve["count"], [0, 0, 2, 2])
    assert np.issubdtype(curve["count"].dtype, np.integer)
    np.testing.assert_allclose(curve["confidence"], [np.nan, np.nan, 0.65, 0.85], rtol=1e-14)
    np.testing.assert_array_equal(curve["accuracy"], [np.nan, np.nan, 0.0, 1.0])
    np.testing.assert_array_equal(curve["edges"], np.linspace(0, 1, 5))
    # ECE = (2/4) |0 - 0.65| + (2/4) |1 - 0.85| = 0.325 + 0.075
    assert metrics.ece(P, Y, n_bins=4) == pytest.approx(0.4, rel=1e-12)
    # confidence exactly 1 lands in the last bin, 0.5 starts bin 1 of 2 (as in calibration_errors)
    curve = metrics.reliability_curve(np.array([[1.0, 0.0], [0.5, 0.5]]), np.array([0, 1]), 2)
    np.testing.assert_array_equal(curve["count"], [0, 2])
    np.testing.assert_array_equal(curve["confidence"], [np.nan, 0.75])
    np.testing.assert_array_equal(curve["accuracy"], [np.nan, 0.5])
    # the default is 15 bins (ece keeps its default of 10)
    assert metrics.reliability_curve(P, Y)["count"].shape == (15,)
    assert metrics.reliability_curve(P, Y)["edges"].shape == (16,)


def _random_probs(rng, m, c):
    """Probabilities with ties and zeros (multinomial counts over a small total, so confidences
    fall on bin edges such as 1/2, 3/4 and 1) mixed with continuous Dirichlet rows."""
    k = int(rng.integers(1, 9))
    probs = rng.multinomial(k, np.full(c, 1.0 / c), size=m) / k
    cont = rng.random(m) < 0.5
    probs[cont] = rng.dirichlet(np.full(c, 0.5), size=int(cont.sum()))
    return probs


@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 80), c=st.integers(2, 6),
       n_bins=st.integers(1, 25))
def test_ece_from_the_reliability_curve(seed, m, c, n_bins):
    rng = np.random.default_rng(seed)
    probs = _random_probs(rng, m, c)
    y = rng.integers(0, c, size=m)
    curve = metrics.reliability_curve(probs, y, n_bins)
    full = curve["count"] > 0
    assert curve["count"].sum() == m
    assert np.all(np.isnan(curve["confidence"][~full]) & np.isnan(curve["accuracy"][~full]))
    gaps = np.abs(curve["accuracy"][full] - curve["confidence"][full])
    # the same sums divided in another order: a few roundings of O(1) numbers apart
    assert np.sum(curve["count"][full] / m * gaps) == pytest.approx(
        metrics.ece(probs, y, n_bins), rel=0, abs=1e-12)
    assert gaps.max() == pytest.approx(metrics.mce(probs, y, n_bins), rel=0, abs=1e-12)


@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 60), decimals=st.integers(0, 2),
       as_bool=st.booleans())
def test_auroc_matches_sklearn(seed, m, decimals, as_bool):
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    scores = np.round(rng.normal(size=m), decimals)  # rounding makes ties (many at decimals=0)
    labels = rng.integers(0, 2, size=m)
    labels[:2] = [0, 1]  # at least one of each
    labels = labels.astype(bool) if as_bool else labels
    # the rank form against sklearn's trapezoidal ROC area: a few roundings of an O(1) number
    assert metrics.auroc(scores, labels) == pytest.approx(
        skm.roc_auc_score(labels, scores), rel=0, abs=1e-12)


@given(seed=st.integers(0, 2**32 - 1), m=st.integers(2, 60), c=st.integers(2, 5))
def test_detection_aurocs_match_sklearn(seed, m, c):
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    probs = _random_probs(rng, m, c)  # repeated rows: tied entropies; zeros: 0 log 0
    pred = np.argmax(probs, axis=1)
    y = rng.integers(0, c, size=m)
    y[0], y[1] = pred[0], (pred[1] + 1) % c  # at least one right and one wrong
    H = metrics.predictive_entropy(probs)
    assert metrics.misclassification_auroc(probs, y) == pytest.approx(
        skm.roc_auc_score(pred == y, -H), rel=0, abs=1e-12)
    probs_out = _random_probs(rng, m + 3, c)
    labels = np.r_[np.zeros(m), np.ones(m + 3)]
    assert metrics.ood_auroc(probs, probs_out) == pytest.approx(
        skm.roc_auc_score(labels, np.r_[H, metrics.predictive_entropy(probs_out)]),
        rel=0, abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_brier_nll_accuracy_match_sklearn(seed):
    skm = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    m, c = 50, 4
    # probabilities >= 0.05 / 1.2: away from 0, so log_loss's clipping never applies
    probs = (rng.dirichlet(np.ones(c), size=m) + 0.05) / (1 + 0.05 * c)
    y = rng.integers(0, c, size=m)
    assert metrics.nll(probs, y) == pytest.approx(
        skm.log_loss(y, probs, labels=np.arange(c)), rel=1e-12)
    assert metrics.accuracy(probs, y) == skm.accuracy_score(y, np.argmax(probs, axis=1))
    # binary: sum_k (p_ik - 1[y_i = k])^2 = (p_i1 - y_i)^2 + ((1 - p_i1) - (1 - y_i))^2
    # = 2 (p_i1 - y_i)^2, i.e. twice sklearn's (binary) Brier score of the class-1 probability
    p1 = rng.random(m)
    y2 = rng.integers(0, 2, size=m)
    assert metrics.brier(np.c_[1 - p1, p1], y2) == pytest.approx(
        2 * skm.brier_score_loss(y2, p1), rel=1e-12)


@pytest.mark.parametrize("call, match", [
    (lambda: metrics.predictive_entropy(np.array([0.5, 0.5])), "probs: expected shape \\(M, C\\)"),
    (lambda: metrics.predictive_entropy(np.array([[0.5, 0.6]])), "probs: .*summing to 1"),
    (lambda: metrics.predictive_entropy(np.array([[np.nan, 1.0]])), "probs: expected finite"),
    (lambda: metrics.auroc([0.1, 0.2], [0, 0]), "labels: .*at least one positive .*0 positives"),
    (lambda: metrics.auroc([0.1, 0.2], [1, 1]), "labels: .*at least one .*negative .*0 negatives"),
    (lambda: metrics.auroc([0.1, np.nan], [0, 1]), "scores: expected finite"),
    (lambda: metrics.auroc([0.1, np.inf], [0, 1]), "scores: expected finite"),
    (lambda: metrics.auroc([0.1, 0.2, 0.3], [0, 1]), "labels: expected the shape of scores"),
    (lambda: metrics.auroc(np.zeros((2, 2)), np.zeros((2, 2), int)), "scores: expected a 1-D"),
    (lambda: metrics.auroc(["a", "b"], [0, 1]), "scores: expected a 1-D array .* real"),
    (lambda: metrics.auroc([0.1, 0.2], [0, 2]), "labels: expected integer or bool labels in"),
    (lambda: metrics.auroc([0.1, 0.2], [0.0, 1.0]), "labels: expected integer or bool"),
    (lambda: metrics.misclassification_auroc(P, np.argmax(P, axis=1)),
     "both correct and wrong predictions, got 4 correct out of 4"),
    (lambda: metrics.misclassification_auroc(P, 1 - np.argmax(P, axis=1)),
     "both correct and wrong predictions, got 0 correct out of 4"),
    (lambda: metrics.misclassification_auroc(P, Y[:3]), "y: expected shape \\(4,\\)"),
    (lambda: metrics.ood_auroc(P, np.full((2, 3), 1 / 3)), "probs_out: expected 2 classes"),
    (lambda: metrics.ood_auroc(P, np.array([[0.5, 0.6]])), "probs_out: .*summing to 1"),
    (lambda: metrics.ood_auroc(np.zeros((0, 2)), P), "probs_in: expected shape \\(M, C\\)"),
    (lambda: metrics.reliability_curve(P, Y, n_bins=0), "n_bins: expected an integer >= 1"),
    (lambda: metrics.reliability_curve(P, Y, n_bins=2.0), "n_bins: expected an integer"),
    (lambda: metrics.reliability_curve(P, np.array([0, 1, 2, 0])), "y: expected integer labels"),
], ids=["entropy-shape", "entropy-sum", "entropy-nan", "auroc-no-positive", "auroc-no-negative",
        "auroc-nan", "auroc-inf", "auroc-shapes", "auroc-2d", "auroc-strings", "auroc-label-2",
        "auroc-float-labels", "misclass-all-right", "misclass-all-wrong", "misclass-y-shape",
        "ood-classes", "ood-out-sum", "ood-in-empty", "curve-bins-0", "curve-bins-float",
        "curve-labels"])
def test_new_metrics_reject_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- device inputs (CuPy): copied to the host once, the same numbers as NumPy -----------------

def _device(xp, a):
    """The array ``a`` on the backend under test: a CuPy copy for xp = cupy; for xp = numpy a
    nested Python list (array_like, so that parameter checks list inputs against arrays rather
    than comparing a call with itself). Non-arrays pass through."""
    if not isinstance(a, np.ndarray):
        return a
    return a.tolist() if xp is np else xp.asarray(a)


def _metric_cases(seed=0):
    """(name, call, NumPy args) for every public metric: rows with ties, zeros and a confidence
    of exactly 1 (bin edges), integer labels, and regression inputs."""
    rng = np.random.default_rng(seed)
    m, c = 40, 4
    probs = _random_probs(rng, m, c)
    probs[0] = [1.0, 0.0, 0.0, 0.0]
    pred = np.argmax(probs, axis=1)
    y = rng.integers(0, c, size=m)
    y[0], y[1] = pred[0], (pred[1] + 1) % c  # at least one right and one wrong
    probs_out = _random_probs(rng, m + 3, c)
    scores = np.round(rng.normal(size=m), 1)  # ties
    labels = rng.integers(0, 2, size=m)
    labels[:2] = [0, 1]
    mean, yr = rng.normal(size=m), rng.normal(size=m)
    var = rng.random(m) + 0.1
    F = rng.normal(size=(5, m))
    return [
        ("nll", metrics.nll, (probs, y)),
        ("accuracy", metrics.accuracy, (probs, y)),
        ("brier", metrics.brier, (probs, y)),
        ("calibration_errors", metrics.calibration_errors, (probs, y, 7)),
        ("ece", metrics.ece, (probs, y)),
        ("mce", metrics.mce, (probs, y)),
        ("auroc", metrics.auroc, (scores, labels)),
        ("auroc-bool", metrics.auroc, (scores, labels.astype(bool))),
        ("misclassification_auroc", metrics.misclassification_auroc, (probs, y)),
        ("ood_auroc", metrics.ood_auroc, (probs, probs_out)),
        ("gaussian_nll", metrics.gaussian_nll, (mean, var, yr)),
        ("mixture_gaussian_nll", metrics.mixture_gaussian_nll, (F, 0.3, yr)),
        ("mixture_gaussian_nll-0d", metrics.mixture_gaussian_nll, (F, np.array(0.3), yr)),
        ("rmse", metrics.rmse, (mean, yr)),
    ]


@pytest.mark.parametrize("case", range(len(_metric_cases())), ids=[c[0] for c in _metric_cases()])
def test_scalar_metrics_on_device_equal_numpy(xp, case):
    # the metric runs on the host copy of its inputs, so a device input gives NumPy's result
    # bit for bit (no tolerance), as Python floats; list inputs too
    name, fn, args = _metric_cases()[case]
    expected = fn(*args)
    got = fn(*(_device(xp, a) for a in args))
    assert type(got) is type(expected), name
    assert got == expected, name


def test_array_metrics_on_device_return_numpy(xp):
    (_, _, (probs, y)), = [c for c in _metric_cases() if c[0] == "nll"]
    H = metrics.predictive_entropy(_device(xp, probs))
    assert type(H) is np.ndarray and H.dtype == np.float64  # documented: NumPy for any input
    np.testing.assert_array_equal(H, metrics.predictive_entropy(probs), strict=True)
    curve = metrics.reliability_curve(_device(xp, probs), _device(xp, y), 6)
    expected = metrics.reliability_curve(probs, y, 6)
    assert curve.keys() == expected.keys()
    for key in expected:
        assert type(curve[key]) is np.ndarray, key
        np.testing.assert_array_equal(curve[key], expected[key], strict=True, err_msg=key)


@pytest.mark.parametrize("fn, args, match", [
    (metrics.nll, (np.array([[0.5, 0.6]]), np.array([0])), "probs: .*summing to 1"),
    (metrics.nll, (np.array([0.5, 0.5]), np.array([0])), "probs: expected shape \\(M, C\\)"),
    (metrics.nll, (P, np.array([0, 1, 2, 0])), "y: expected integer labels in"),
    (metrics.accuracy, (P, np.array([0.0, 1.0, 1.0, 0.0])), "y: expected integer labels"),
    (metrics.brier, (P, Y[:3]), "y: expected shape \\(4,\\)"),
    (metrics.calibration_errors, (P, Y, 0), "n_bins: expected an integer >= 1"),
    (metrics.reliability_curve, (P, Y, 2.0), "n_bins: expected an integer"),
    (metrics.predictive_entropy, (np.array([[np.nan, 1.0]]),), "probs: expected finite"),
    (metrics.auroc, (np.array([0.1, 0.2]), np.array([0, 0])), "labels: .*0 positives"),
    (metrics.auroc, (np.array([0.1, np.inf]), np.array([0, 1])), "scores: expected finite"),
    (metrics.auroc, (np.zeros((2, 2)), np.zeros((2, 2), int)), "scores: expected a 1-D"),
    (metrics.auroc, (np.array([0.1, 0.2]), np.array([0, 2])), "labels: expected integer or bool"),
    (metrics.auroc, (np.array([0.1, 0.2, 0.3]), np.array([0, 1])), "labels: expected the shape"),
    (metrics.misclassification_auroc, (P, np.argmax(P, axis=1)), "got 4 correct out of 4"),
    (metrics.ood_auroc, (P, np.full((2, 3), 1 / 3)), "probs_out: expected 2 classes"),
    (metrics.ood_auroc, (np.zeros((0, 2)), P), "probs_in: expected shape \\(M, C\\)"),
    (metrics.gaussian_nll, (np.zeros(2), np.array([1.0, 0.0]), np.zeros(2)), "var: expected ent"),
    (metrics.gaussian_nll, (np.zeros(3), np.ones(2), np.zeros(2)), "mean, var: expected shape"),
    (metrics.mixture_gaussian_nll, (np.zeros((1, 2)), 0.0, np.zeros(2)), "noise_var: expected"),
    (metrics.mixture_gaussian_nll, (np.zeros((1, 3)), 1.0, np.zeros(2)), "F: expected shape"),
    (metrics.rmse, (np.zeros(3), np.zeros(2)), "mean: expected shape \\(2,\\)"),
    (metrics.rmse, (np.zeros(2), np.zeros((2, 1))), "y: expected shape \\(M,\\)"),
], ids=["nll-sum", "nll-shape", "nll-label-range", "accuracy-float-labels", "brier-y-shape",
        "calibration-bins-0", "curve-bins-float", "entropy-nan", "auroc-no-positive", "auroc-inf",
        "auroc-2d", "auroc-label-2", "auroc-shapes", "misclass-all-right", "ood-classes",
        "ood-in-empty", "gaussian-var", "gaussian-shape", "mixture-noise", "mixture-F-shape",
        "rmse-shape", "rmse-y-2d"])
def test_bad_device_inputs_are_named(xp, fn, args, match):
    with pytest.raises(ValueError, match=match):
        fn(*(_device(xp, a) for a in args))


# the xp fixture's cupy parameter alone (as tests/conftest.py marks it): these tests need a device
_CUPY_ONLY = pytest.mark.parametrize("xp", [pytest.param("cupy", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not cupy_available(),
                                        reason="CuPy with a CUDA device is not available")])],
    indirect=True)


@_CUPY_ONLY
@pytest.mark.parametrize("case", range(len(_metric_cases())), ids=[c[0] for c in _metric_cases()])
def test_mixed_numpy_and_device_inputs_are_refused(xp, case):
    name, fn, args = _metric_cases()[case]
    arrays = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    for keep_on_host in arrays:  # each array in turn left on the host, the others on the device
        mixed = [a if i == keep_on_host else _device(xp, a) for i, a in enumerate(args)]
        with pytest.raises(ValueError, match="expected all on one backend"):
            fn(*mixed)


@_CUPY_ONLY
def test_device_inputs_are_copied_once_without_implicit_syncs(xp):
    standin = getattr(xp, "_standin", None)
    if standin is None:
        pytest.skip("sync counting needs the CuPy stand-in (REFBAYES_CUPY_STANDIN=1)")
    for name, fn, args in _metric_cases():
        device = [_device(xp, a) for a in args]
        with standin.count_syncs() as log:
            fn(*device)
        n_arrays = sum(isinstance(a, np.ndarray) for a in args)
        assert (log.implicit, log.explicit) == (0, n_arrays), (name, dict(log.by_site))
