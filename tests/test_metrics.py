"""refbayes.metrics against hand computations."""
import math

import numpy as np
import pytest

from refbayes import metrics

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
