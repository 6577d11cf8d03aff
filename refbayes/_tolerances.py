"""Numerical tolerances with their reasons: one place, used by the test suite and by
``refbayes reproduce selfcheck``.

Relative errors are ``max|a - b| / max|b|``: a fraction of the reference's scale.
"""
import numpy as np

from refbayes.backend import to_numpy

__all__ = ["EXACT_F64", "EXACT_F32", "CONVERGED", "QUADRATURE", "QUADRATURE_WIDE", "ODE_F64",
           "MC_SIGMAS", "EVIDENCE_OPTIMUM", "EVIDENCE_STATIONARY", "exact", "kl_zero", "rel_err"]

# Exact identities evaluated two ways in float64 (Woodbury vs a dense inverse, a closed-form
# gradient vs autograd): both sides round at ~1e-16 per operation; the condition numbers of the
# generated inputs are bounded (SPD matrices built as A A^T + delta I with delta >= 0.1), which
# keeps the accumulated error below 1e-12, so 1e-10 leaves two orders of headroom.
EXACT_F64 = 1e-10

# The same identities in float32: unit roundoff 6e-8, amplified by the same bounded condition
# numbers and by O(D) summations; 1e-3 relative is the stated float32 contract.
EXACT_F32 = 1e-3

# "Converges to the known answer": an iteration run to its fixed point (full batch, eps = 0, a
# few hundred steps) against the closed-form fixed point, relative (or a KL in nats). The runs
# reach 1e-13..1e-15; the fixed point is reached geometrically, so 1e-8 separates "converged" from
# "converged somewhere else" (the errata's wrong fixed points sit 1e-3 to 1e0 away) with margin.
CONVERGED = 1e-8

# Gauss-Hermite expectations of smooth functions vs adaptive quadrature (scipy.integrate.quad,
# epsabs=epsrel=1e-13): the accuracy target for the quadrature.
QUADRATURE = 1e-12

# The same for 400 < v <= 1600: the integrands (log sigmoid ~ |a|) reach sqrt(v) in size and the
# 16384-65536-term sums round at ~1e-16 of that; measured worst case 3.8e-12 at the rung
# thresholds, so 1e-11.
QUADRATURE_WIDE = 1e-11

# Two computations of one geodesic ODE solution on t in [0, 1] (riemannian_laplace: two solves
# with different right-hand-side paths, a solve on [0, t] against one of t v on [0, 1], the
# conserved speed c'^T M c' at t = 1 against t = 0), each solved by DOP853 at rtol = atol = 1e-12.
# The solver holds each step's local error estimate below 1e-12 (relative) and the global error
# of an error-controlled explicit Runge-Kutta solve grows from that by the ODE's Lipschitz factor
# over the unit interval and the number of steps (12-43 here); measured worst case 1.3e-12 on the
# test problems, so 1e-8 leaves three orders of headroom, while the wrong answers the tests
# separate (the straight line theta + v, a dropped Sherman-Morrison denominator, the official
# defaults' atol = 1e-3 solve) sit 1e-3 to 1e-1 away.
ODE_F64 = 1e-8


# Monte Carlo estimates against their exact expectation (laplace: the MC link of the GLM
# predictive vs adaptive quadrature of E[sigmoid(f)], the sampling predictive of Bayesian linear
# regression vs its closed form): |estimate - exact| <= MC_SIGMAS * sd / sqrt(S), sd the
# estimator's standard deviation per draw (computed in closed form or by quadrature, not from the
# draws). The draws come from a fixed seed; for a correct estimator a 5-sigma excursion has
# probability 6e-7 per comparison (CLT), while the errors the tests must catch (a wrong square
# root, a missing noise term, the probit approximation in place of the expectation) are 10-1000
# sigma away at the sample sizes used.
MC_SIGMAS = 5.0

# The location of an evidence maximum found two ways (laplace: alternating MAP refits with the
# post-hoc optimiser of the Laplace evidence vs scipy's Nelder-Mead on the closed-form Bayesian
# linear regression evidence, xatol = 1e-12), relative in the hyperparameters. Both stop on
# tolerances near the maximum, where log Z is flat to second order: a stopping error eps in the
# function moves the argument by ~sqrt(eps / curvature). Measured agreement 6.5e-8 (one delta
# and tau) and 1.3e-7 (delta per tensor and tau), set by Nelder-Mead's stopping (unchanged with
# 2.5 times more alternations), so 1e-6 leaves a factor 7 or more, while a wrong gradient (a
# missing factor p of the EF, a missing trace term) or the fixed-MAP optimum without refits lands
# 1e-4..1e-1 away (the test checks the latter is more than 1e-4 away).
EVIDENCE_OPTIMUM = 1e-6

# The gradient of the Laplace evidence w.r.t. the log hyperparameters at the point where
# optimize_prior_precision's L-BFGS-B stops (laplace; gtol 1e-10, ftol 0): it stops when the
# float64 log Z (|log Z| ~ 36-38 on the test problem) no longer decreases along its line search,
# so the gradient left is set by that rounding, not by gtol. Measured max |g| (prior groups and
# log tau): 5e-9 (scalar prior), 2e-9 (per tensor), 6e-8 (per parameter, 31 groups); 1e-6
# absolute leaves a factor 16 over the worst.
EVIDENCE_STATIONARY = 1e-6

def exact(dtype) -> float:
    """The exact-identity tolerance for ``dtype``."""
    return EXACT_F32 if np.dtype(dtype) == np.float32 else EXACT_F64


def kl_zero(dtype, D: int) -> float:
    """Absolute bound on a KL divergence that is exactly 0 (a Gaussian against itself, or against
    another parameterization of itself).

    KL = (tr(Sigma_p^{-1} Sigma_q) - D + m^T Sigma_p^{-1} m + log-det difference) / 2 cancels sums
    of D terms of size ~1, so its rounding error is absolute and grows like D: the exact-identity
    tolerance per dimension.
    """
    return exact(dtype) * D


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (max|b| floored at 1e-300 so an all-zero reference is an absolute test)."""
    a, b = np.asarray(to_numpy(a), dtype=np.float64), np.asarray(to_numpy(b), dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"a, b: expected one shape, got {a.shape} and {b.shape}")
    return float(np.max(np.abs(a - b), initial=0.0) / max(np.max(np.abs(b), initial=0.0), 1e-300))
