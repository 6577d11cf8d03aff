"""``refbayes trace METHOD``: one step (or one fit, or a short SWAG run) on a small shipped
problem, every named intermediate printed under its Algorithm 1 line and equation tag.

The point is verification: another implementation (PyTorch, JAX, laplace-torch, the official RLA,
SWAG or Noisy K-FAC code, ...) is fed the same problem, state and draws, takes one step, and
compares its intermediates with these, one equation at a time. So everything a step consumes is
printed (and, with ``--json``, written exactly).

The step methods (slang, ngvi-full, ngvi-meanfield):

- the problem: ``make_logistic_regression(n=50, p=5, seed=0)`` (X (50, 5), y (50,)), the model
  ``LogisticRegression(5)`` with its intercept as the last parameter, D = 6, N = 50, prior
  precision lam = 1 on every parameter;
- the draws, all from ``rng = numpy.random.default_rng(seed)`` in this order: the starting state
  ``mu = 0.5 * rng.standard_normal(D)``, ``U = 0.5 * rng.standard_normal((D, L))``,
  ``d = rng.uniform(0.5, 1.5, D)``, ``g_bar = rng.standard_normal(D)`` (only when t > 0; at
  t = 0 it is zero, as after ``init``), then the minibatch ``idx = rng.permutation(N)[:M]`` (the
  driver's first batch of an epoch), then ``eps = rng.standard_normal((D, S))`` (not for
  curvature "exact"). The full Gaussian starts at the same q, Sigma_inv = U U^T + diag(d); the
  mean field at its diagonal, prec_diag = d + sum_j U_j^2. A non-zero U makes fast_sample and
  the truncation do real work (the paper's start U = 0 would hide errors there);
- the step's Info fields, in order, each as ``[line N (tag)] name shape`` and its values (in full
  up to SHOW_ALL entries, else the first SHOW_FIRST and the norm; inputs always in full).

The Laplace methods (laplace, riemannian-laplace), refbayes.methods.laplace and
refbayes.methods.riemannian_laplace at one MAP:

- the problem, a 1-d nonlinear regression drawn by a fixed recipe (no file needed):
  ``prng = numpy.random.default_rng(0)``, ``X = prng.uniform(-3.0, 3.0, (30, 1))``, then
  ``y = sin(X[:, 0]) + prng.standard_normal(30) / 4`` (noise precision 16), and the model
  ``MLP([1, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=16.0)``, D = 13,
  N = 30 (a network fitting a curve, so the four hidden units differ, and the GGN, the Hessian
  and the empirical Fisher differ; D small enough that every D x D matrix is printed in full);
  the test inputs of the GLM predictive ``X_star = numpy.linspace(-3.0, 3.0, 5)[:, None]``;
  prior p(theta) = N(0, I / prior_precision) (``--prior-precision``, default 1); structures
  "full", "diag" and "kron" (K-FAC of the GGN or EF; H and the precision printed as the dense
  block-diagonal blockdiag_l(A_l kron B_l) and its sum with delta I), over the whole network or
  its last layer (``--subset last_layer``, D_q = 5: H, the precision and the evidence terms are
  the last layer's, the MAP and the RLA's L keep the prior on all 13 parameters);
- the MAP, deterministic and independent of the seed (``find_map``): the minimiser of the
  negative log joint L(theta) = sum_i l_i(theta) + (1/2) theta^T diag(delta) theta, from
  ``theta0 = model.init_theta(numpy.random.default_rng(0))`` by ``scipy.optimize.minimize``
  (L-BFGS-B, jac = grad L, gtol = 1e-12, ftol = 0, maxcor = 20, maxiter = 10000), then up to
  MAX_NEWTON Newton steps theta <- theta - (model.hessian + diag(delta))^{-1} grad L, stopping
  at the first step that does not reduce |grad L|_2 (that step is discarded). The result is
  printed in full, with |grad L(theta_map)|_2, which must be below MAP_GTOL (else an error);
- the draws: ``eps = numpy.random.default_rng(seed).standard_normal((D_q, S))`` (D_q = D = 13,
  or 5 for the last layer), the only draws;
- laplace: ``LaplaceInfo``: H (laplace.2), the precision (laplace.3), the samples
  theta_s = laplace.sample(state, eps) (laplace.4), the evidence terms (laplace.5), laplace-torch's
  log_det_ratio and scatter (laplace.6), and the GLM predictive at X_star (laplace.7);
- riemannian-laplace: ``RiemannianLaplaceInfo``: the same precision and theta_s, the printed
  velocities v_s = theta_map - theta_s (riemannian_laplace.10), g = grad L(theta_map), and per
  velocity the exponential map's end point c(1), end velocity c'(1), solver counters and the
  conserved squared speed c'^T M(c) c' at t = 0 and t = 1 (riemannian_laplace.2),
  (riemannian_laplace.11); L is the negative log joint above (``riemannian_laplace.loss_fns``:
  grad_fn = model.grad + delta theta, hvp_fn = model.hvp + delta u); solver settings from
  ``--ode-method``, ``--rtol``, ``--atol``
  (default the official code's RK45, 1e-6, 1e-3). For the official code's velocity sign use -V.

SWAG (swag), refbayes.methods.swag: T momentum-SGD steps from a start, a snapshot collected
after each, then the SWAG Gaussian, its draws and their log density:

- the problem of the step methods (``make_logistic_regression(n=50, p=5, seed=0)``,
  ``LogisticRegression(5)``, D = 6, N = 50) and the MAP objective
  sum_i l_i(theta) + (lam / 2) |theta|^2 with lam = 1 (weight decay lam / N on the mean loss);
- the draws, all from ``rng = numpy.random.default_rng(seed)`` in this order: the start
  ``theta0 = 0.5 * rng.standard_normal(D)``; then for each of the T (``--steps``) SGD steps its
  minibatch ``rng.permutation(N)[:M]`` (a fresh permutation per step; row t of the printed
  idx (T, M) is the batch of step t + 1); then ``z1 = rng.standard_normal((D, S))`` and
  ``z2 = rng.standard_normal((K', S))``, K' = min(T, K);
- the run: ``swag.sgd_init(theta0)`` and ``swag.init(theta0, cfg)``; for each step
  ``swag.sgd_step`` on its batch with ``SGDConfig(N, lam=1.0, alpha, momentum)`` (defaults
  alpha = 2e-3, momentum = 0.9: torch.optim.SGD(lr = N alpha = 0.1, momentum = 0.9,
  weight_decay = lam / N = 0.02) on the mean loss), then ``swag.collect`` of the new iterate with
  ``SWAGConfig(K, scale)`` (defaults K = 4, scale = 0.5). Collecting after every step makes a
  short trace exercise the ring buffer: with the defaults T = 6 > K = 4 it wraps, and K' = K,
  where the official code's divisor max_num_models - 1 equals refbayes' K' - 1. T >= 2 and
  K >= 2 (the low-rank covariance (swag.5) divides by K' - 1);
- ``SWAGTraceInfo``: per step (row t of a (T, D) array is step t + 1) SGDInfo's g (swag.8),
  v and theta (swag.9) and SWAGInfo's theta_bar (swag.1), theta2_bar (swag.2) and dev (swag.3);
  then ``diag_variance`` (swag.4), ``deviations`` D_hat (D, K'), columns oldest first (swag.3)
  (the official ``cov_mat_sqrt`` is D_hat^T), ``dense_covariance`` (swag.6),
  theta_s = ``sample(state, z1, z2, cfg)`` (swag.7) and ``log_density`` at theta_s (swag.11);
  and SWAG-Diagonal with the same z1: ``sample(state, z1, None, cfg)`` and its log density at
  scale 1 (the paper's SWAG-Diagonal, N(theta_SWA, Sigma_diag)). theta_SWA is the last row of
  theta_bar.

Noisy K-FAC and K-FAC (noisy-kfac, kfac), refbayes.methods.noisy_kfac: one ``noisy_kfac.step``,
K-FAC being the same step with eps = None (everything at the mean, no draws):

- the problem: the step methods' data (``make_logistic_regression(n=50, p=5, seed=0)``), its
  labels {0, 1} the two classes of ``MLP([5, 4, 2], activation="tanh",
  likelihood="categorical")``, D = 34 (layer 1: theta[0:24], A_1 (6, 6), S_1 (4, 4); layer 2:
  theta[24:34], A_2 (5, 5), S_2 (2, 2): every matrix is printed in full), N = 50; the config
  ``NoisyKFACConfig(N, **NK_CONFIG)``: kl_weight = 0.5 and eta = 0.2 (the prior VARIANCE), so
  gamma_in = kl_weight / (N eta) = 0.05 differs from each misreading (1 / (N eta), kl_weight / N,
  eta / N, kl_weight eta / N), gamma_ex = 0.01, alpha = 0.1, beta = 0.2, momentum = 0.9,
  T_stats = T_inv = 1 (statistics and refresh at this step); damping, curvature and kl_clip from
  the options (default "factored", "ggn", None; the official code's estimator is "mc", its
  kl_clip 1e-3);
- the draws, all from ``rng = numpy.random.default_rng(seed)`` in this order: the mean
  ``mu = 0.5 * rng.standard_normal(D)``; the momentum buffer
  ``m = 0.05 * rng.standard_normal(D)`` (about the size of P, so both terms of (noisy_kfac.11)
  show: a zero buffer hides the first); the factors A_1, A_2, then S_1, S_2, each
  ``B @ B.T / n + I / 2`` with ``B = rng.standard_normal((n, n))`` (SPD and not the identity:
  identity factors make the solve and the sampler a scaling with pi = 1, hiding a transposed or
  swapped factor and the pi split); A_ref = A, S_ref = S (as after a refresh), t = 0; then
  ``idx = rng.permutation(N)[:M]``; then (noisy-kfac only) ``eps = rng.standard_normal((D, S))``;
  then (curvature "mc" only) ``u = rng.random((S, M))`` (S = 1 for kfac) and the sampled labels
  ``y_tilde[s, i] = min(#{c : cumsum(p[s, i])_c <= u[s, i]}, C - 1)`` (the inverse CDF) of the
  predictive ``p[s] = model.predict(w_s, X_B)`` (softmax) at the step's own draws
  ``w = noisy_kfac.sample(state, eps, cfg, model)`` (the mean for kfac);
- the sampling map, so that another implementation reproduces w from eps: per layer, with
  ``E_s = eps[start:stop, s].reshape(n_in + 1, n_out)`` (row-major) and the mean's block M,
  "factored": W_s = M + sqrt(kl_weight / N) L_A^{-T} E_s L_S^{-1}, L_A and L_S the lower Cholesky
  factors of A_ref + pi sqrt(gamma_in) I and S_ref + (sqrt(gamma_in) / pi) I; "exact":
  W_s = M + sqrt(kl_weight / N) Q_A ((Q_A^T E_s Q_S) / sqrt(Lam)) Q_S^T, the symmetric square
  root of (A_ref kron S_ref + gamma_in I)^{-1}, Lam[i, j] = lam_A[i] lam_S[j] + gamma_in (unique:
  the eigenvectors' signs cancel, so any eigensolver reproduces w). The official code's
  U_c E V_c^T (derivations/noisy_kfac.md) is another square root: the same distribution, other
  draws for the same E;
- ``NoisyKFACTraceInfo``: the damping split pi per layer (noisy_kfac.5) (factored damping only),
  then the ``NoisyKFACInfo`` fields w (noisy_kfac.7), V (noisy_kfac.8), P (noisy_kfac.9) (after
  the clipping), m and mu (noisy_kfac.11), A_hat and S_hat (noisy_kfac.3), the KL-clipping
  factor nu (noisy_kfac.10) (1 unless ``--kl-clip`` bounds the step), then the state's new
  running factors A and S (noisy_kfac.4) (also its new A_ref, S_ref: T_inv = 1). A tuple prints
  one block per layer, ``A_hat[0]`` being layer 1's.

The k-tied Normal (ktied), refbayes.methods.ktied: one ``ktied.step`` (reparameterisation
gradients through the tie A_l = U_l V_l^T, Adam on [mu; rho]):

- the problem, a 3-class problem drawn by a fixed recipe (no file needed):
  ``prng = numpy.random.default_rng(0)``, ``X = prng.standard_normal((30, 4))``,
  ``W = prng.standard_normal((4, 3))``, then the labels of that linear teacher with noise,
  ``y = argmax(X @ W + prng.standard_normal((30, 3)), axis=1)`` (int64; 11, 7 and 12 of
  classes 0, 1, 2), and the classifier ``MLP([4, 5, 3], activation="tanh",
  likelihood="categorical")``, D = 43 (W_1 theta[0:20] (4, 5), b_1 theta[20:25], W_2
  theta[25:40] (5, 3), b_2 theta[40:43]), N = 30: both weight matrices have a larger rank
  (min(m_l, n_l) = 4 and 3) than the default tie k = 2, so the tie constrains both;
  ``ktied.layout(model, k)`` places R^U_l, R^V_l and r^b_l in rho (k = 2: P = 42, layer 1
  rho[0:8], rho[8:18], rho[18:23], layer 2 rho[23:33], rho[33:39], rho[39:42]), and is printed;
  the config ``KTiedConfig(N, lam=1.0)`` (= bbb.BBBConfig; Adam's defaults alpha = 1e-3,
  beta1 = 0.9, beta2 = 0.999, eps_adam = 1e-8, and kl_weight = 1, the paper's ELBO), prior
  N(0, I / lam) on every parameter;
- the draws, all from ``rng = numpy.random.default_rng(seed)`` in this order: the mean
  ``mu = 0.5 * rng.standard_normal(D)``; ``xi = rng.standard_normal(P)`` for the start
  ``ktied.init(mu, model, k, sigma0=0.3, xi=xi, jitter=0.5)``, i.e. rho = softplus^{-1}(c_l) +
  0.5 xi, c_l = sqrt(0.3 / k_l) for R^U_l, R^V_l (U_l V_l^T = 0.3 before the jitter) and 0.3
  for r^b_l (ktied.8), zero Adam moments, t = 0 (a jitter well above the library's default 0.1,
  so that the k columns of each U_l and V_l differ visibly: equal columns hide a transposed or
  mis-sliced factor); then ``idx = rng.permutation(N)[:M]``; then
  ``eps = rng.standard_normal((D, S))`` (at seed 0 this stream is the recipe's, so mu and xi
  repeat entries of X, as the other traces' draws repeat their problem's at seed 0);
- printed in full as inputs: idx, the batch, xi, eps, the state's mu and rho and the positive
  factors of ``ktied.scale_parameters`` (U_l = softplus(R^U_l), V_l, and the bias scales
  softplus(r^b_l); ``state.U[0]`` is layer 1's);
- ``KTiedTraceInfo``: the ``KTiedInfo`` fields sigma (ktied.1), theta (ktied.2), g (bbb.4),
  g_hat (bbb.5), g_sigma (ktied.5), kl (ktied.4), grad_mu (bbb.9), grad_sigma (ktied.5),
  grad_rho (ktied.6), loss_hat and elbo (ktied.3), delta, mu and rho (ktied.7), then the new
  state's Adam moments m (adam.1) and v (adam.2) of [mu; rho]: with mu and rho, the whole new
  state KTiedState(mu, rho, AdamState(m, v, 1), t = 1, k).

``TAGS`` maps every Info field to the Algorithm 1 line and equation tag written in the trailing
comment of its NamedTuple field (tests/test_trace.py checks that the two agree, and that the
SWAG trace's tags are those of the swag.SGDInfo, swag.SWAGInfo and swag.SWAGState fields, the
Noisy K-FAC trace's those of the noisy_kfac.NoisyKFACInfo and NoisyKFACState fields, and the
k-tied trace's those of the ktied.KTiedInfo and adam.AdamState fields).

The driver methods (vogn, ogn, vadam, vprop, noisy-adam, bbb, mc-dropout, adam, slang-mlp) are
traced by ``refbayes.golden`` (its module docstring gives the problem, the starts and the draws),
their tags read off their Info classes' field comments. Every method here registers a
``golden.Tracer``, so ``--save FILE`` writes a golden trace of any of them, ``--steps K`` chains
K steps (step 1 is the step printed above) and ``--dtype float32`` runs the step and driver
methods in float32; those runs are printed in the golden form (``format_golden``).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg
from scipy.optimize import minimize

from refbayes import golden
from refbayes._checks import check_in_range, check_int
from refbayes.datasets import make_logistic_regression
from refbayes.experiments._io import atomic_write_text
from refbayes.linalg import kron, lowrank
from refbayes.methods import ktied, laplace, ngvi, noisy_kfac, riemannian_laplace, slang, swag
from refbayes.methods._estimates import Batch, check_curvature
from refbayes.methods.adam import AdamState
from refbayes.methods.driver import epoch_batches
from refbayes.models import MLP, LogisticRegression

__all__ = ["KFAC_METHODS", "KTIED_METHODS", "LAPLACE_METHODS", "METHODS", "STEP_METHODS",
           "SWAG_METHODS", "TAGS", "KTiedTraceInfo", "KTiedTraceInputs", "LaplaceInfo",
           "LaplaceTraceInputs", "MAPResult", "NoisyKFACTraceInfo", "NoisyKFACTraceInputs",
           "RiemannianLaplaceInfo", "SWAGTraceInfo", "SWAGTraceInputs", "TraceInputs",
           "add_arguments", "find_map", "format_trace", "format_values", "make_inputs",
           "make_ktied_inputs", "make_laplace_inputs", "make_noisy_kfac_inputs",
           "make_swag_inputs", "run", "step", "tag_label", "to_json", "trace_ktied",
           "trace_laplace", "trace_noisy_kfac", "trace_swag"]

STEP_METHODS = ("slang", "ngvi-full", "ngvi-meanfield")
LAPLACE_METHODS = ("laplace", "riemannian-laplace")
SWAG_METHODS = ("swag",)
KFAC_METHODS = ("noisy-kfac", "kfac")  # kfac: noisy_kfac.step with eps = None
KTIED_METHODS = ("ktied",)
# the methods with a tag table (TAGS) and a printed form of their own
TABLE_METHODS = STEP_METHODS + LAPLACE_METHODS + SWAG_METHODS + KFAC_METHODS + KTIED_METHODS
# traced by refbayes.golden only (K chained driver steps on its MLP problem), tags read off their
# Info classes' field comments
DRIVER_METHODS = tuple(golden.TRACERS)
METHODS = TABLE_METHODS + DRIVER_METHODS

# The shipped problem.
N_ROWS = 50
N_FEATURES = 5
PROBLEM_SEED = 0
SHOW_ALL = 200      # arrays up to this many entries are printed in full
SHOW_FIRST = 10     # entries shown of a larger array, with its norm

# The shipped problem of the Laplace methods (module docstring).
LA_ROWS = 30
LA_HIDDEN = 4
LA_NOISE_PRECISION = 16.0
LA_PROBLEM_SEED = 0
LA_TEST_INPUTS = 5  # X_star = numpy.linspace(-3.0, 3.0, LA_TEST_INPUTS)[:, None]
LA_STRUCTURES = ("full", "diag", "kron")
MAP_INIT_SEED = 0   # theta0 = model.init_theta(numpy.random.default_rng(MAP_INIT_SEED))
MAP_LBFGS = {"gtol": 1e-12, "ftol": 0.0, "maxcor": 20, "maxiter": 10000}
MAX_NEWTON = 10
# |grad L(theta_map)|_2 the MAP recipe must reach: L-BFGS-B alone stops near 1e-7 on this
# problem, the Newton steps bring it to 1e-14..1e-15 (roundoff of a gradient of size ~10);
# 1e-10 leaves four orders of headroom and still makes grad L = 0 hold to the digits printed.
MAP_GTOL = 1e-10
# The smallest rtol riemannian_laplace accepts (below it solve_ivp raises rtol silently).
RTOL_MIN = 100 * float(np.finfo(np.float64).eps)

# The SWAG trace (module docstring): the step methods' problem, prior precision SWAG_LAM as weight
# decay, and SWAG-Diagonal at the paper's scale.
SWAG_LAM = 1.0
SWAG_DIAG_SCALE = 1.0

# The Noisy K-FAC trace (module docstring): the step methods' data as two classes of a small
# tanh MLP, and a config in which every hyperparameter is distinct from 1 and from the others'
# misreadings (gamma_in = 0.5 / (50 * 0.2) = 0.05).
NK_SIZES = (N_FEATURES, 4, 2)
NK_ACTIVATION = "tanh"
NK_CONFIG = {"eta": 0.2, "kl_weight": 0.5, "alpha": 0.1, "beta": 0.2, "momentum": 0.9,
             "gamma_ex": 0.01, "T_stats": 1, "T_inv": 1}
NK_MEAN_SCALE = 0.5       # mu = NK_MEAN_SCALE * rng.standard_normal(D)
NK_MOMENTUM_SCALE = 0.05  # m = NK_MOMENTUM_SCALE * rng.standard_normal(D): about |P|'s entries

# The k-tied trace (module docstring): a 3-class problem drawn by a fixed recipe (X, a linear
# teacher W, label noise, all from numpy.random.default_rng(KT_PROBLEM_SEED)), a tanh MLP whose
# two weight matrices are both wider than the default rank, and a start jittered well above
# ktied.init's default 0.1 so that the columns of each U_l, V_l differ.
KT_ROWS = 30
KT_SIZES = (4, 5, 3)
KT_ACTIVATION = "tanh"
KT_PROBLEM_SEED = 0
KT_LAM = 1.0
KT_MEAN_SCALE = 0.5  # mu = KT_MEAN_SCALE * rng.standard_normal(D)
KT_SIGMA0 = 0.3      # ktied.init's sigma0: U_l V_l^T = sigma0 before the jitter
KT_JITTER = 0.5      # ktied.init's jitter: rho = softplus^{-1}(start) + KT_JITTER * xi

# Info field -> (Algorithm 1 line or None, equation tag), in the Info field order: the trailing
# comments of SLANGInfo, ngvi.FullInfo and ngvi.MeanFieldInfo, transcribed.
TAGS: dict[str, dict[str, tuple[str | None, str]]] = {
    "slang": {
        "alpha_t": (None, "(ngvi.12)"),
        "beta_t": ("2", "(ngvi.12)"),
        "theta": ("4", "(slang.2)"),
        "G": ("6", "(slang.3)"),
        "W": ("7", "(slang.4)"),
        "U": ("7, 9", "(slang.4)"),
        "Delta_d": ("8", "(slang.5)"),
        "d": ("10", "(slang.6)"),
        "g_tilde": ("11", "(slang.7)"),
        "direction": (None, "(ngvi.13)"),
        "Delta_mu": ("12", "(slang.8)"),
        "mu": ("13", "(slang.8)"),
    },
    "ngvi-full": {
        "alpha_t": (None, "(ngvi.12)"),
        "beta_t": (None, "(ngvi.12)"),
        "theta": (None, "(ngvi.4)"),
        "G": (None, "(ngvi.5)"),
        "g_hat": (None, "(ngvi.6) / (ngvi.9)"),
        "C_hat": (None, "(ngvi.7)-(ngvi.9)"),
        "Sigma_inv": (None, "(ngvi.10)"),
        "g_tilde": (None, "(ngvi.11)"),
        "direction": (None, "(ngvi.13)"),
        "Delta_mu": (None, "(ngvi.11)"),
        "mu": (None, "(ngvi.11)"),
    },
    "ngvi-meanfield": {
        "alpha_t": (None, "(ngvi.12)"),
        "beta_t": (None, "(ngvi.12)"),
        "theta": (None, "(ngvi.14)"),
        "G": (None, "(ngvi.5)"),
        "g_hat": (None, "(ngvi.6) / (ngvi.9)"),
        "c_hat": (None, "(ngvi.7)-(ngvi.9)"),
        "prec_diag": (None, "(ngvi.15)"),
        "g_tilde": (None, "(ngvi.16)"),
        "direction": (None, "(ngvi.13)"),
        "Delta_mu": (None, "(ngvi.16)"),
        "mu": (None, "(ngvi.16)"),
    },
    # the trailing comments of LaplaceInfo and RiemannianLaplaceInfo below (no Algorithm lines)
    "laplace": {
        "H": (None, "(laplace.2)"),
        "precision": (None, "(laplace.3)"),
        "theta_s": (None, "(laplace.4)"),
        "log_lik": (None, "(laplace.5)"),
        "log_prior": (None, "(laplace.5)"),
        "log_det": (None, "(laplace.5)"),
        "log_Z": (None, "(laplace.5)"),
        "log_det_ratio": (None, "(laplace.6)"),
        "scatter": (None, "(laplace.6)"),
        "f_mean": (None, "(laplace.7)"),
        "f_var": (None, "(laplace.7)"),
        "y_var": (None, "(laplace.7)"),
    },
    "riemannian-laplace": {
        "precision": (None, "(laplace.3)"),
        "theta_s": (None, "(laplace.4)"),
        "V": (None, "(riemannian_laplace.10)"),
        "g": (None, "(riemannian_laplace.1)"),
        "c": (None, "(riemannian_laplace.9)"),
        "cdot": (None, "(riemannian_laplace.8)"),
        "nfev": (None, "(riemannian_laplace.8)"),
        "n_steps": (None, "(riemannian_laplace.8)"),
        "speed_0": (None, "(riemannian_laplace.2)"),
        "speed_1": (None, "(riemannian_laplace.11)"),
    },
    # the trailing comments of SWAGTraceInfo below: those of swag.SGDInfo (g, v, theta),
    # swag.SWAGInfo (theta_bar, theta2_bar, dev) and swag.SWAGState (D_hat), then the final terms
    "swag": {
        "g": (None, "(swag.8)"),
        "v": (None, "(swag.9)"),
        "theta": (None, "(swag.9)"),
        "theta_bar": (None, "(swag.1)"),
        "theta2_bar": (None, "(swag.2)"),
        "dev": (None, "(swag.3)"),
        "Sigma_diag": (None, "(swag.4)"),
        "D_hat": (None, "(swag.3)"),
        "Sigma": (None, "(swag.6)"),
        "theta_s": (None, "(swag.7)"),
        "log_q": (None, "(swag.11)"),
        "theta_s_diag": (None, "(swag.7)"),
        "log_q_diag": (None, "(swag.11)"),
    },
    # the trailing comments of NoisyKFACTraceInfo below: pi, then those of noisy_kfac.NoisyKFACInfo
    # (w .. nu) and noisy_kfac.NoisyKFACState (A, S); kfac is the same step with eps = None
    "noisy-kfac": {
        "pi": (None, "(noisy_kfac.5)"),
        "w": (None, "(noisy_kfac.7)"),
        "V": (None, "(noisy_kfac.8)"),
        "P": (None, "(noisy_kfac.9)"),
        "m": (None, "(noisy_kfac.11)"),
        "mu": (None, "(noisy_kfac.11)"),
        "A_hat": (None, "(noisy_kfac.3)"),
        "S_hat": (None, "(noisy_kfac.3)"),
        "nu": (None, "(noisy_kfac.10)"),
        "A": (None, "(noisy_kfac.4)"),
        "S": (None, "(noisy_kfac.4)"),
    },
}
TAGS["kfac"] = dict(TAGS["noisy-kfac"])
# the trailing comments of KTiedTraceInfo below: those of ktied.KTiedInfo (sigma .. rho), then
# those of adam.AdamState (m, v) for the new state's Adam moments
TAGS["ktied"] = {
    "sigma": (None, "(ktied.1)"),
    "theta": (None, "(ktied.2)"),
    "g": (None, "(bbb.4)"),
    "g_hat": (None, "(bbb.5)"),
    "g_sigma": (None, "(ktied.5)"),
    "kl": (None, "(ktied.4)"),
    "grad_mu": (None, "(bbb.9)"),
    "grad_sigma": (None, "(ktied.5)"),
    "grad_rho": (None, "(ktied.6)"),
    "loss_hat": (None, "(ktied.3)"),
    "elbo": (None, "(ktied.3)"),
    "delta": (None, "(ktied.7)"),
    "mu": (None, "(ktied.7)"),
    "rho": (None, "(ktied.7)"),
    "m": (None, "(adam.1)"),
    "v": (None, "(adam.2)"),
}

STEPS = {"slang": slang.step, "ngvi-full": ngvi.step_full, "ngvi-meanfield": ngvi.step_meanfield}


class LaplaceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace laplace``, in the printed order.

    Attributes
    ----------
    H : array of shape (D, D), or (D,) for structure "diag"
        Curvature of sum_i l_i at theta_map (the configured GGN, Hessian or EF), its
        diagonal, or for "kron" the dense blockdiag_l(A_l kron B_l).  (laplace.2), (laplace.20)
    precision : array of shape (D, D), or (D,) for structure "diag"
        The state's Sigma_inv = H + diag(delta) (symmetrised), prec_diag = diag(H) + delta,
        or the dense K-FAC precision.  (laplace.3), (laplace.20)
    theta_s : array of shape (D, S)
        Samples ``laplace.sample(state, eps)``.  (laplace.4)
    log_lik : float
        log p(D | theta_map) = -sum_i l_i(theta_map).  (laplace.5)
    log_prior : float
        log p(theta_map) under N(0, diag(delta)^{-1}).  (laplace.5)
    log_det : float
        log det of the precision (Cholesky for "full").  (laplace.5)
    log_Z : float
        ``laplace.log_marginal_likelihood``.  (laplace.5)
    log_det_ratio : float
        laplace-torch's log det precision - sum_j log delta_j.  (laplace.6)
    scatter : float
        laplace-torch's theta_map^T diag(delta) theta_map.  (laplace.6)
    f_mean : array of shape (M*, K)
        GLM predictive mean at X_star.  (laplace.7)
    f_var : array of shape (M*, K, K)
        J Sigma J^T at X_star.  (laplace.7)
    y_var : array of shape (M*, K, K)
        f_var + I / noise_precision.  (laplace.7)
    """
    H: Any              # curvature of sum_i l_i at theta*, (D, D) or (D,)  (laplace.2)
    precision: Any      # Sigma_inv (D, D) or prec_diag (D,)  (laplace.3)
    theta_s: Any        # mu + L^{-T} eps_s or mu + eps_s / sqrt(prec_diag), (D, S)  (laplace.4)
    log_lik: Any        # log p(D | theta*) = -sum_i l_i(theta*), ()  (laplace.5)
    log_prior: Any      # log p(theta*), ()  (laplace.5)
    log_det: Any        # log det of the precision, ()  (laplace.5)
    log_Z: Any          # log marginal likelihood, ()  (laplace.5)
    log_det_ratio: Any  # log det precision - sum_j log delta_j, ()  (laplace.6)
    scatter: Any        # theta*^T diag(delta) theta*, ()  (laplace.6)
    f_mean: Any         # f(x*, theta*), (M*, K)  (laplace.7)
    f_var: Any          # J Sigma J^T, (M*, K, K)  (laplace.7)
    y_var: Any          # f_var + I / noise_precision, (M*, K, K)  (laplace.7)


class RiemannianLaplaceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace riemannian-laplace``, in the printed order.

    Attributes
    ----------
    precision : array of shape (D, D), or (D,) for structure "diag"
        The Laplace precision at theta_map.  (laplace.3)
    theta_s : array of shape (D, S)
        Laplace samples ``laplace.sample(state, eps)``.  (laplace.4)
    V : array of shape (D, S)
        Velocities v_s = theta_map - theta_s.  (riemannian_laplace.10)
    g : array of shape (D,)
        grad L(theta_map), L the negative log joint (zero up to MAP_GTOL).
        (riemannian_laplace.1)
    c : array of shape (D, S)
        End points c_s(1) = Exp_{theta_map}(v_s).  (riemannian_laplace.9)
    cdot : array of shape (D, S)
        End velocities c_s'(1).  (riemannian_laplace.8)
    nfev : array of shape (S,)
        Right-hand-side evaluations of each solve.  (riemannian_laplace.8)
    n_steps : array of shape (S,)
        Accepted steps of each solve.  (riemannian_laplace.8)
    speed_0 : array of shape (S,)
        v_s^T M(theta_map) v_s.  (riemannian_laplace.2)
    speed_1 : array of shape (S,)
        c_s'(1)^T M(c_s(1)) c_s'(1), equal to speed_0 up to the solver's error.
        (riemannian_laplace.11)
    """
    precision: Any  # Sigma_inv (D, D) or prec_diag (D,)  (laplace.3)
    theta_s: Any    # Laplace samples, (D, S)  (laplace.4)
    V: Any          # v_s = theta_map - theta_s, (D, S)  (riemannian_laplace.10)
    g: Any          # grad L(theta_map), (D,)  (riemannian_laplace.1)
    c: Any          # c_s(1) = Exp_{theta_map}(v_s), (D, S)  (riemannian_laplace.9)
    cdot: Any       # c_s'(1), (D, S)  (riemannian_laplace.8)
    nfev: Any       # solve_ivp right-hand-side evaluations, (S,)  (riemannian_laplace.8)
    n_steps: Any    # solve_ivp accepted steps, (S,)  (riemannian_laplace.8)
    speed_0: Any    # v_s^T M(theta_map) v_s, (S,)  (riemannian_laplace.2)
    speed_1: Any    # c'^T M(c) c' at t = 1, (S,)  (riemannian_laplace.11)


class TraceInputs(NamedTuple):
    """Everything one traced step consumes, and how it was drawn.

    Attributes
    ----------
    method : str
        One of STEP_METHODS.
    seed : int
        Seed of numpy.random.default_rng, the only source of the draws.
    L : int
        Columns of the drawn U (SLANG's rank; the low-rank part of the ngvi start).
    model : LogisticRegression
        ``LogisticRegression(N_FEATURES)``, D = N_FEATURES + 1.
    X : numpy.ndarray of shape (N, N_FEATURES)
        The shipped training set.
    y : numpy.ndarray of shape (N,)
        Labels in {0, 1}.
    idx : numpy.ndarray of shape (M,)
        Minibatch rows, rng.permutation(N)[:M].
    eps : numpy.ndarray of shape (D, S) or None
        Standard-normal draws, or None for curvature "exact".
    state : SLANGState or FullState or MeanFieldState
        The starting state.
    cfg : SLANGConfig or NGVIConfig
        The step's config.
    """
    method: str     # one of METHODS
    seed: int       # of numpy.random.default_rng, the only source of the draws
    L: int          # columns of the drawn U (SLANG's rank; the low-rank part of the ngvi start)
    model: Any      # LogisticRegression(N_FEATURES), D = N_FEATURES + 1
    X: np.ndarray   # (N, N_FEATURES) the shipped training set
    y: np.ndarray   # (N,) labels in {0, 1}
    idx: np.ndarray  # (M,) minibatch rows, rng.permutation(N)[:M]
    eps: Any        # (D, S) standard-normal draws, or None for curvature "exact"
    state: Any      # SLANGState | FullState | MeanFieldState
    cfg: Any        # SLANGConfig | NGVIConfig

    @property
    def batch(self) -> Batch:
        return Batch(self.X[self.idx], self.y[self.idx])


# method -> the function that builds its inputs
_BUILDER = {**dict.fromkeys(STEP_METHODS, "make_inputs"),
            **dict.fromkeys(LAPLACE_METHODS, "make_laplace_inputs"),
            **dict.fromkeys(SWAG_METHODS, "make_swag_inputs"),
            **dict.fromkeys(KFAC_METHODS, "make_noisy_kfac_inputs"),
            **dict.fromkeys(KTIED_METHODS, "make_ktied_inputs"),
            **dict.fromkeys(DRIVER_METHODS, "refbayes.golden.build")}


def _check_method(method) -> str:
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    return method


def make_inputs(method: str, *, seed: int = 0, M: int = 8, S: int = 1, L: int = 2,
                curvature: str | None = None, momentum: float = 0.0, t: int = 0) -> TraceInputs:
    """Build the problem, the starting state and the draws of one traced step.

    The draws are made in the module docstring's order.

    Parameters
    ----------
    method : {"slang", "ngvi-full", "ngvi-meanfield"}
        The traced step.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int, default 1
        Monte Carlo draws, >= 1.
    L : int, default 2
        Columns of the drawn U, in [1, D].
    curvature : {"ef", "hess", "exact"} or None, default None
        Curvature of the ngvi methods (None: "ef"); SLANG is "ef" only.
    momentum : float, default 0.0
        The momentum b of (ngvi.13).
    t : int, default 0
        Steps already taken (sets alpha_t, beta_t and the bias correction).

    Returns
    -------
    TraceInputs
        The problem, state, config and draws.

    Raises
    ------
    ValueError
        If method is not a step method or an option is outside its range.
    """
    method = _check_method(method)
    if method not in STEP_METHODS:
        raise ValueError(f"method: make_inputs traces {', '.join(STEP_METHODS)}; "
                         f"use {_BUILDER[method]} for {method!r}")
    seed = check_int(seed, "seed", low=0)
    N, D = N_ROWS, N_FEATURES + 1
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    L = check_int(L, "L", low=1, high=D)
    t = check_int(t, "t", low=0)
    curvature = check_curvature("ef" if curvature is None else curvature)
    if method == "slang" and curvature != "ef":
        raise ValueError("curvature: SLANG uses the empirical Fisher only ('ef'), "
                         f"got {curvature!r}")
    X, y, _ = make_logistic_regression(N, N_FEATURES, PROBLEM_SEED)
    model = LogisticRegression(N_FEATURES)
    lam = np.ones(D)

    rng = np.random.default_rng(seed)
    mu = 0.5 * rng.standard_normal(D)
    U = 0.5 * rng.standard_normal((D, L))
    d = rng.uniform(0.5, 1.5, D)
    g_bar = rng.standard_normal(D) if t > 0 else np.zeros(D)
    idx = epoch_batches(rng, N, M)[0]
    eps = None if curvature == "exact" else rng.standard_normal((D, S))

    if method == "slang":
        state = slang.init(mu, U, d)
        cfg = slang.SLANGConfig(N=N, lam=lam, L=L, momentum=momentum)
    elif method == "ngvi-full":
        state = ngvi.init_full(mu, lowrank.dense_precision(U, d))
        cfg = ngvi.NGVIConfig(N=N, lam=lam, curvature=curvature, momentum=momentum)
    else:
        state = ngvi.init_meanfield(mu, d + np.sum(U * U, axis=1))
        cfg = ngvi.NGVIConfig(N=N, lam=lam, curvature=curvature, momentum=momentum)
    state = state._replace(g_bar=g_bar, t=t)
    return TraceInputs(method, seed, L, model, X, y, idx, eps, state, cfg)


def step(inputs: TraceInputs):
    """Take the method's step on these inputs: a direct, deterministic call.

    Parameters
    ----------
    inputs : TraceInputs
        From ``make_inputs``.

    Returns
    -------
    state : NamedTuple
        The new state.
    info : NamedTuple
        The step's Info, the traced intermediates.
    """
    return STEPS[inputs.method](inputs.state, inputs.batch, inputs.eps, inputs.cfg, inputs.model)


# ----------------------------------------------------------------------------- Laplace methods

class MAPResult(NamedTuple):
    """The deterministic MAP of the Laplace traces and how it was reached.

    Attributes
    ----------
    theta_map : numpy.ndarray of shape (D,)
        The MAP estimate theta*.
    theta0 : numpy.ndarray of shape (D,)
        The starting point of L-BFGS-B.
    lbfgs_nit : int
        L-BFGS-B iterations.
    newton_steps : int
        Newton steps kept after L-BFGS-B.
    grad_norm : float
        |grad L(theta_map)|_2, L the negative log joint.
    """
    theta_map: Any     # (D,)
    theta0: Any        # (D,)
    lbfgs_nit: int
    newton_steps: int
    grad_norm: float


class LaplaceTraceInputs(NamedTuple):
    """Everything one Laplace (or Riemannian Laplace) trace consumes, and how it was drawn.

    Attributes
    ----------
    method : str
        "laplace" or "riemannian-laplace".
    seed : int
        Seed of numpy.random.default_rng, the only source of eps.
    model : MLP
        ``MLP([1, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=16.0)``.
    X : numpy.ndarray of shape (N, 1)
        The shipped training inputs.
    y : numpy.ndarray of shape (N,)
        The shipped training targets.
    X_star : numpy.ndarray of shape (M*, 1)
        Test inputs of the GLM predictive.
    map : MAPResult
        The MAP and its report.
    eps : numpy.ndarray of shape (D_q, S)
        Standard-normal draws, one row per random parameter (D_q = D for subset "all").
    cfg : LaplaceConfig
        Prior precision, structure and curvature.
    ode : RiemannianLaplaceConfig or None
        Solver settings (riemannian-laplace), else None.
    """
    method: str
    seed: int
    model: Any
    X: np.ndarray
    y: np.ndarray
    X_star: np.ndarray
    map: MAPResult
    eps: np.ndarray
    cfg: Any
    ode: Any

    @property
    def delta(self) -> np.ndarray:
        """The prior precision per parameter, (D,): the MAP's and L's prior on all of theta."""
        return np.full(self.model.D, float(self.cfg.prior_precision))


def _neg_log_joint(model, X, y, delta):
    """(L, grad L) and theta -> H[L] of L = sum_i l_i + (1/2) theta^T diag(delta) theta."""
    def fun(theta):
        return (model.loss(theta, X, y) + 0.5 * np.sum(delta * theta * theta),
                model.grad(theta, X, y) + delta * theta)

    def hess(theta):
        return model.hessian(theta, X, y) + np.diag(delta)
    return fun, hess


def find_map(model, X, y, delta) -> MAPResult:
    """Find the MAP of the Laplace traces by the recipe of the module docstring.

    L-BFGS-B on L(theta) = sum_i l_i(theta) + (1/2) theta^T diag(delta) theta from
    ``model.init_theta(numpy.random.default_rng(MAP_INIT_SEED))`` with the options MAP_LBFGS,
    then at most MAX_NEWTON Newton steps with the dense Hessian of L, each kept only if it
    reduces |grad L|_2.  (laplace.1)

    Parameters
    ----------
    model : FlatModel
        A NumPy model (the Newton steps use its autograd Hessian).
    X : numpy.ndarray of shape (N, n_in)
        Training inputs, float64.
    y : numpy.ndarray of shape (N,) or (N, n_out)
        Training targets.
    delta : numpy.ndarray of shape (D,)
        Prior precision per parameter, > 0.

    Returns
    -------
    MAPResult
        The MAP theta_map, the start theta0, the iteration counts and |grad L(theta_map)|_2.

    Raises
    ------
    ValueError
        If the recipe ends with |grad L|_2 >= MAP_GTOL (not a stationary point to the digits
        the trace prints).
    """
    fun, hess = _neg_log_joint(model, X, y, delta)
    theta0 = model.init_theta(np.random.default_rng(MAP_INIT_SEED), dtype=np.float64)
    res = minimize(fun, theta0, jac=True, method="L-BFGS-B", options=dict(MAP_LBFGS))
    theta = np.asarray(res.x, dtype=np.float64)
    gnorm = float(np.linalg.norm(fun(theta)[1]))
    steps = 0
    for _ in range(MAX_NEWTON):
        candidate = theta - np.linalg.solve(hess(theta), fun(theta)[1])
        cnorm = float(np.linalg.norm(fun(candidate)[1]))
        if not cnorm < gnorm:
            break
        theta, gnorm, steps = candidate, cnorm, steps + 1
    if not gnorm < MAP_GTOL:
        raise ValueError(f"MAP: the recipe stopped at |grad L|_2 = {gnorm:.3e}, expected below "
                         f"MAP_GTOL = {MAP_GTOL:g} (L-BFGS-B: {res.message})")
    return MAPResult(theta, theta0, int(res.nit), steps, gnorm)


def _problem():
    """(model, X, y, X_star) of the Laplace traces, by the module docstring's recipe."""
    prng = np.random.default_rng(LA_PROBLEM_SEED)
    X = prng.uniform(-3.0, 3.0, (LA_ROWS, 1))
    y = np.sin(X[:, 0]) + prng.standard_normal(LA_ROWS) / math.sqrt(LA_NOISE_PRECISION)
    model = MLP([1, LA_HIDDEN, 1], activation="tanh", likelihood="gaussian",
                noise_precision=LA_NOISE_PRECISION)
    X_star = np.linspace(-3.0, 3.0, LA_TEST_INPUTS)[:, None]
    return model, X, y, X_star


@functools.lru_cache(maxsize=8)
def _cached_map(prior_precision: float) -> MAPResult:
    model, X, y, _ = _problem()
    return find_map(model, X, y, np.full(model.D, prior_precision))


def _shipped_map(prior_precision: float) -> MAPResult:
    """find_map on the shipped problem (deterministic, so cached), as fresh arrays."""
    found = _cached_map(prior_precision)
    return found._replace(theta_map=found.theta_map.copy(), theta0=found.theta0.copy())


def _one_of(value, name: str, allowed, method: str):
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {', '.join(allowed)} for {method}, "
                         f"got {value!r}")
    return value


def make_laplace_inputs(method: str, *, seed: int = 0, S: int = 2, prior_precision: float = 1.0,
                        structure: str = "full", curvature: str = "ggn", ode_method: str = "RK45",
                        rtol: float = 1e-6, atol: float = 1e-3,
                        subset: str = "all") -> LaplaceTraceInputs:
    """Build the problem, the MAP, the config and the draws of a Laplace trace.

    The order and recipes are those of the module docstring; the MAP depends on prior_precision
    only, never on seed.

    Parameters
    ----------
    method : {"laplace", "riemannian-laplace"}
        The traced method.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``; eps = rng.standard_normal((D, S)).
    S : int, default 2
        Number of draws (samples, velocities), >= 1.
    prior_precision : float, default 1.0
        The prior precision delta > 0, the same for every parameter.
    structure : {"full", "diag", "kron"}, default "full"
        Precision structure of the Laplace approximation.
    curvature : {"ggn", "hessian", "ef"}, default "ggn"
        Curvature H of the Laplace precision (laplace-torch's default GGN).
    ode_method : {"RK45", "RK23", "DOP853"}, default "RK45"
        ``solve_ivp`` method (riemannian-laplace only).
    rtol : float, default 1e-6
        Relative tolerance of the solve (riemannian-laplace only).
    atol : float, default 1e-3
        Absolute tolerance of the solve (riemannian-laplace only).
    subset : {"all", "last_layer"}, default "all"
        The random parameters: all D, or the last layer's D_q (laplace.25).

    Returns
    -------
    LaplaceTraceInputs
        The problem, test inputs, MAP, draws and configs.

    Raises
    ------
    ValueError
        If method is not a Laplace method, seed < 0, S < 1, prior_precision not a finite
        value > 0, structure, curvature, subset or ode_method not one of the names above, rtol not in
        [100 eps, 1) or atol not in [0, inf), or the MAP recipe does not reach MAP_GTOL.
    """
    method = _check_method(method)
    if method not in LAPLACE_METHODS:
        raise ValueError(f"method: make_laplace_inputs traces {', '.join(LAPLACE_METHODS)}; "
                         f"use {_BUILDER[method]} for {method!r}")
    seed = check_int(seed, "seed", low=0)
    S = check_int(S, "S", low=1)
    prior_precision = check_in_range(prior_precision, "prior_precision", 0.0, math.inf,
                                     low_open=True, high_open=True)
    structure = _one_of(structure, "structure", LA_STRUCTURES, method)
    curvature = _one_of(curvature, "curvature", ("ggn", "hessian", "ef"), method)
    subset = _one_of(subset, "subset", laplace.SUBSETS, method)
    cfg = laplace.LaplaceConfig(prior_precision=prior_precision, structure=structure,
                                curvature=curvature, subset=subset)
    ode = None
    if method == "riemannian-laplace":
        ode_method = _one_of(ode_method, "ode_method", riemannian_laplace.METHODS, method)
        rtol = check_in_range(rtol, "rtol", RTOL_MIN, 1.0, high_open=True)
        atol = check_in_range(atol, "atol", 0.0, math.inf, high_open=True)
        ode = riemannian_laplace.RiemannianLaplaceConfig(ode_method, rtol, atol)
    model, X, y, X_star = _problem()
    found = _shipped_map(prior_precision)
    D_q = model.last_layer(found.theta_map, X)[0].D if subset == "last_layer" else model.D
    eps = np.random.default_rng(seed).standard_normal((D_q, S))
    return LaplaceTraceInputs(method, seed, model, X, y, X_star, found, eps, cfg, ode)


def _dense_curvature(H):
    """H as printed: the array laplace.curvature returns, or for "kron" the dense block-diagonal
    blockdiag_l(A_l kron B_l) (laplace.20)."""
    if not isinstance(H, tuple):
        return H
    return scipy.linalg.block_diag(*[kron.dense(A, B) for A, B in H])


def _precision(state):
    if state.kron is not None:
        return laplace.dense_precision(state)  # (laplace.20)
    return state.Sigma_inv if state.Sigma_inv is not None else state.prec_diag


def _log_det(precision) -> float:
    if precision.ndim == 2:
        return float(2.0 * np.sum(np.log(np.diagonal(np.linalg.cholesky(precision)))))
    return float(np.sum(np.log(precision)))


def trace_laplace(inputs: LaplaceTraceInputs):
    """Compute every named intermediate of a Laplace trace by direct library calls.

    laplace: ``laplace.fit``, ``sample``, ``log_marginal_likelihood``, ``glm_predictive``;
    riemannian-laplace: the same fit and samples, then ``riemannian_laplace.velocities``,
    ``sample`` and ``squared_speed`` with L the negative log joint.

    Parameters
    ----------
    inputs : LaplaceTraceInputs
        From ``make_laplace_inputs``.

    Returns
    -------
    LaplaceInfo or RiemannianLaplaceInfo
        The intermediates, in the printed order.

    Raises
    ------
    ValueError
        If the library rejects the inputs (e.g. an indefinite precision).
    RuntimeError
        If a geodesic solve stops before t = 1.
    """
    model, X, y, cfg = inputs.model, inputs.X, inputs.y, inputs.cfg
    theta_map, delta = inputs.map.theta_map, inputs.delta
    state = laplace.fit(model, theta_map, X, y, cfg)  # (laplace.2), (laplace.3)
    precision = _precision(state)
    theta_s = laplace.sample(state, inputs.eps)  # (laplace.4)
    if inputs.method == "laplace":
        H = _dense_curvature(laplace.curvature(model, theta_map, X, y, cfg))  # (laplace.2)
        log_lik = -float(model.loss(theta_map, X, y))  # (laplace.5)
        # the random block theta[n_fixed:] and its prior (all of theta for subset "all")
        mu_q, delta_q = theta_map[state.n_fixed:], delta[state.n_fixed:]  # (laplace.25)
        D_q = mu_q.shape[0]
        log_prior = float(0.5 * (np.sum(np.log(delta_q)) - D_q * math.log(2.0 * math.pi)
                                 - np.sum(delta_q * mu_q * mu_q)))  # (laplace.5)
        log_det = _log_det(precision)  # (laplace.5)
        log_Z = laplace.log_marginal_likelihood(model, state, X, y, cfg)  # (laplace.5)
        log_det_ratio = log_det - float(np.sum(np.log(delta_q)))  # (laplace.6)
        scatter = float(np.sum(delta_q * mu_q * mu_q))  # (laplace.6)
        pred = laplace.glm_predictive(model, state, inputs.X_star)  # (laplace.7)
        return LaplaceInfo(H, precision, theta_s, log_lik, log_prior, log_det, log_Z,
                           log_det_ratio, scatter, pred.f_mean, pred.f_var, pred.y_var)

    # L = sum_i l_i + (1/2) theta^T diag(delta) theta  (riemannian_laplace.14)
    grad_fn, hvp_fn = riemannian_laplace.loss_fns(model, X, y, delta)

    V = riemannian_laplace.velocities(theta_map, theta_s)  # (riemannian_laplace.10)
    g = grad_fn(theta_map)  # (riemannian_laplace.1)
    C, rep = riemannian_laplace.sample(theta_map, V, grad_fn, hvp_fn, inputs.ode)
    S = V.shape[1]
    speed_0 = np.array([riemannian_laplace.squared_speed(grad_fn, theta_map, V[:, s].copy())
                        for s in range(S)])  # (riemannian_laplace.2)
    speed_1 = np.array([riemannian_laplace.squared_speed(grad_fn, C[:, s].copy(),
                                                         rep.cdot[:, s].copy())
                        for s in range(S)])  # (riemannian_laplace.11)
    return RiemannianLaplaceInfo(precision, theta_s, V, g, C, rep.cdot, rep.nfev, rep.n_steps,
                                 speed_0, speed_1)


# ----------------------------------------------------------------------------- SWAG

class SWAGTraceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace swag``, in the printed order.

    The first six are stacked over the T steps: row t belongs to step t + 1 (its SGDInfo and the
    SWAGInfo of the collection after it).

    Attributes
    ----------
    g : array of shape (T, D)
        Objective gradient (N / M) sum_{i in B} grad l_i(theta_t) + lam theta_t.  (swag.8)
    v : array of shape (T, D)
        Momentum buffer v_{t+1} = momentum v_t + g.  (swag.9)
    theta : array of shape (T, D)
        Iterates theta_{t+1} = theta_t - alpha v_{t+1}: the snapshots.  (swag.9)
    theta_bar : array of shape (T, D)
        Running mean after each collection; the last row is theta_SWA.  (swag.1)
    theta2_bar : array of shape (T, D)
        Running second moment after each collection.  (swag.2)
    dev : array of shape (T, D)
        Deviation theta_n - theta_bar_n of each snapshot (the first is zero).  (swag.3)
    Sigma_diag : array of shape (D,)
        max(theta2_bar - theta_bar^2, var_clamp) at the end, ``swag.diag_variance``.  (swag.4)
    D_hat : array of shape (D, K')
        ``swag.deviations``: the last K' deviations as columns, oldest first.  (swag.3)
    Sigma : array of shape (D, D)
        scale (diag(Sigma_diag) + D_hat D_hat^T / (K' - 1)), ``swag.dense_covariance``.
        (swag.6)
    theta_s : array of shape (D, S)
        SWAG draws ``swag.sample(state, z1, z2, cfg)``.  (swag.7)
    log_q : array of shape (S,)
        ``swag.log_density`` of the SWAG Gaussian at theta_s.  (swag.11)
    theta_s_diag : array of shape (D, S)
        SWAG-Diagonal draws ``swag.sample(state, z1, None, cfg)`` at scale SWAG_DIAG_SCALE.
        (swag.7)
    log_q_diag : array of shape (S,)
        ``swag.log_density(low_rank=False)`` of SWAG-Diagonal at theta_s_diag.  (swag.11)
    """
    g: Any             # (N / M) sum_{i in B} grad l_i(theta_t) + lam theta_t, (T, D)  (swag.8)
    v: Any             # v_{t+1} = momentum v_t + g, (T, D)  (swag.9)
    theta: Any         # theta_{t+1} = theta_t - alpha v_{t+1}, the snapshots, (T, D)  (swag.9)
    theta_bar: Any     # theta_bar_n after each collection, (T, D)  (swag.1)
    theta2_bar: Any    # running second moment after each collection, (T, D)  (swag.2)
    dev: Any           # theta_n - theta_bar_n, (T, D)  (swag.3)
    Sigma_diag: Any    # max(theta2_bar - theta_bar^2, var_clamp), (D,)  (swag.4)
    D_hat: Any         # the last K' deviations as columns, oldest first, (D, K')  (swag.3)
    Sigma: Any         # scale (Sigma_diag + D_hat D_hat^T / (K' - 1)), (D, D)  (swag.6)
    theta_s: Any       # SWAG draws from z1, z2, (D, S)  (swag.7)
    log_q: Any         # log q(theta_s), (S,)  (swag.11)
    theta_s_diag: Any  # SWAG-Diagonal draws from z1 at scale 1, (D, S)  (swag.7)
    log_q_diag: Any    # SWAG-Diagonal log q(theta_s_diag), (S,)  (swag.11)


class SWAGTraceInputs(NamedTuple):
    """Everything ``refbayes trace swag`` consumes, and how it was drawn.

    Attributes
    ----------
    method : str
        "swag".
    seed : int
        Seed of numpy.random.default_rng, the only source of the draws.
    model : LogisticRegression
        ``LogisticRegression(N_FEATURES)``, D = N_FEATURES + 1.
    X : numpy.ndarray of shape (N, N_FEATURES)
        The shipped training set.
    y : numpy.ndarray of shape (N,)
        Labels in {0, 1}.
    theta0 : numpy.ndarray of shape (D,)
        The start, 0.5 * rng.standard_normal(D).
    idx : numpy.ndarray of shape (T, M)
        Row t: the minibatch rows of step t + 1, rng.permutation(N)[:M].
    z1 : numpy.ndarray of shape (D, S)
        Standard-normal draws of the diagonal part.
    z2 : numpy.ndarray of shape (K', S)
        Standard-normal draws of the low-rank part, row j for the j-th oldest deviation.
    sgd : swag.SGDConfig
        The SGD step's config.
    cfg : swag.SWAGConfig
        The SWAG config (K, scale, var_clamp).
    """
    method: str          # "swag"
    seed: int            # of numpy.random.default_rng, the only source of the draws
    model: Any           # LogisticRegression(N_FEATURES), D = N_FEATURES + 1
    X: np.ndarray        # (N, N_FEATURES) the shipped training set
    y: np.ndarray        # (N,) labels in {0, 1}
    theta0: np.ndarray   # (D,) the start
    idx: np.ndarray      # (T, M) minibatch rows, row t for step t + 1
    z1: np.ndarray       # (D, S)
    z2: np.ndarray       # (K', S)
    sgd: Any             # swag.SGDConfig
    cfg: Any             # swag.SWAGConfig

    @property
    def diag_cfg(self):
        """The SWAG-Diagonal config: cfg at scale SWAG_DIAG_SCALE."""
        return self.cfg._replace(scale=SWAG_DIAG_SCALE)

    def batch(self, t: int) -> Batch:
        """The minibatch of step t + 1 (row t of idx)."""
        return Batch(self.X[self.idx[t]], self.y[self.idx[t]])


def _check_at_least_two(n, name: str) -> int:
    n = check_int(n, name)
    if n < 2:
        raise ValueError(f"{name}: expected an integer in [2, None] (the low-rank covariance "
                         f"divides by K' - 1, K' = min(steps, K)), got {n}")
    return n


def make_swag_inputs(*, seed: int = 0, steps: int = 6, M: int = 8, S: int = 2, K: int = 4,
                     scale: float = 0.5, alpha: float = 2e-3,
                     momentum: float = 0.9) -> SWAGTraceInputs:
    """Build the problem, the configs and the draws of the SWAG trace.

    The draws are made in the module docstring's order.

    Parameters
    ----------
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    steps : int, default 6
        SGD steps T, each followed by a collection, >= 2.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int, default 2
        Draws of each Gaussian, >= 1.
    K : int, default 4
        Deviation buffer size, >= 2.
    scale : float, default 0.5
        SWAG's covariance multiplier, > 0 (SWAG-Diagonal uses SWAG_DIAG_SCALE).
    alpha : float, default 2e-3
        SGD step size on the summed objective, > 0 (torch lr = N alpha).
    momentum : float, default 0.9
        Heavy-ball momentum, in [0, 1).

    Returns
    -------
    SWAGTraceInputs
        The problem, start, minibatches, draws and configs.

    Raises
    ------
    ValueError
        If an option is outside its range.
    """
    seed = check_int(seed, "seed", low=0)
    N, D = N_ROWS, N_FEATURES + 1
    steps = _check_at_least_two(steps, "steps")
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    K = _check_at_least_two(K, "K")
    scale = check_in_range(scale, "scale", 0.0, math.inf, low_open=True, high_open=True)
    alpha = check_in_range(alpha, "alpha", 0.0, math.inf, low_open=True, high_open=True)
    momentum = check_in_range(momentum, "momentum", 0.0, 1.0, high_open=True)
    X, y, _ = make_logistic_regression(N, N_FEATURES, PROBLEM_SEED)
    model = LogisticRegression(N_FEATURES)
    sgd = swag.SGDConfig(N=N, lam=SWAG_LAM, alpha=alpha, momentum=momentum)
    cfg = swag.SWAGConfig(K=K, scale=scale)

    rng = np.random.default_rng(seed)
    theta0 = 0.5 * rng.standard_normal(D)
    idx = np.stack([epoch_batches(rng, N, M)[0] for _ in range(steps)])
    z1 = rng.standard_normal((D, S))
    z2 = rng.standard_normal((min(steps, K), S))
    return SWAGTraceInputs("swag", seed, model, X, y, theta0, idx, z1, z2, sgd, cfg)


def trace_swag(inputs: SWAGTraceInputs) -> SWAGTraceInfo:
    """Run the SWAG trace by direct calls of refbayes.methods.swag.

    ``sgd_init`` and ``init`` at theta0; per step ``sgd_step`` then ``collect`` of the new
    iterate; then ``diag_variance``, ``deviations``, ``dense_covariance``, ``sample`` and
    ``log_density`` (SWAG, cfg) and ``sample`` and ``log_density`` without the low-rank term
    (SWAG-Diagonal, ``inputs.diag_cfg``).

    Parameters
    ----------
    inputs : SWAGTraceInputs
        From ``make_swag_inputs``.

    Returns
    -------
    SWAGTraceInfo
        The intermediates, in the printed order.
    """
    model, cfg, diag = inputs.model, inputs.cfg, inputs.diag_cfg
    opt = swag.sgd_init(inputs.theta0.copy())
    state = swag.init(inputs.theta0, cfg)
    per_step = {f: [] for f in swag.SGDInfo._fields + swag.SWAGInfo._fields}
    for t in range(inputs.idx.shape[0]):
        opt, sgd_info = swag.sgd_step(opt, inputs.batch(t), None, inputs.sgd, model)
        state, swag_info = swag.collect(state, opt.theta, cfg)
        for f, value in (sgd_info._asdict() | swag_info._asdict()).items():
            per_step[f].append(np.array(value))  # a copy: collect's dev is a view of its buffer
    theta_s = swag.sample(state, inputs.z1, inputs.z2, cfg)
    theta_s_diag = swag.sample(state, inputs.z1, None, diag)
    return SWAGTraceInfo(
        **{f: np.stack(rows) for f, rows in per_step.items()},
        Sigma_diag=swag.diag_variance(state, cfg),
        D_hat=swag.deviations(state),
        Sigma=swag.dense_covariance(state, cfg),
        theta_s=theta_s,
        log_q=swag.log_density(state, theta_s, cfg),
        theta_s_diag=theta_s_diag,
        log_q_diag=swag.log_density(state, theta_s_diag, diag, low_rank=False))


# ----------------------------------------------------------------------------- Noisy K-FAC

class NoisyKFACTraceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace noisy-kfac`` (and ``kfac``), as printed.

    The fields w .. nu are those of ``noisy_kfac.NoisyKFACInfo``; A and S are the new state's.

    Attributes
    ----------
    pi : array of shape (L,) or None
        The factored-damping split sqrt((tr A_ref / (n_in + 1)) / (tr S_ref / n_out)) of each
        layer, used by the sampler and the solve; None for damping "exact".  (noisy_kfac.5)
    w : array of shape (D, S)
        The draws (K-FAC: the mean as one column).  (noisy_kfac.7)
    V : array of shape (D,)
        Per-example gradient at the draws plus gamma_in w.  (noisy_kfac.8)
    P : array of shape (D,)
        Preconditioned gradient.  (noisy_kfac.9)
    m : array of shape (D,)
        New momentum buffer.  (noisy_kfac.11)
    mu : array of shape (D,)
        New mean.  (noisy_kfac.11)
    A_hat : tuple of arrays
        Minibatch input statistics, (n_in + 1, n_in + 1) per layer.  (noisy_kfac.3)
    S_hat : tuple of arrays
        Minibatch output statistics, (n_out, n_out) per layer.  (noisy_kfac.3)
    nu : float
        KL-clipping factor min(1, sqrt(kl_clip / (alpha^2 <V, P>))) already applied to P
        (1 without clipping).  (noisy_kfac.10)
    A : tuple of arrays
        The running input factors after the step (also the new A_ref: T_inv = 1).
        (noisy_kfac.4)
    S : tuple of arrays
        The running output factors after the step (also the new S_ref).  (noisy_kfac.4)
    """
    pi: Any      # damping split per layer, (L,), or None for exact damping (noisy_kfac.5)
    w: Any       # draws, (D, S) (noisy_kfac.7)
    V: Any       # gradient at the draws + gamma_in w, (D,) (noisy_kfac.8)
    P: Any       # preconditioned gradient, (D,) (noisy_kfac.9)
    m: Any       # new momentum buffer, (D,) (noisy_kfac.11)
    mu: Any      # new mean, (D,) (noisy_kfac.11)
    A_hat: Any   # minibatch input statistics, per layer (noisy_kfac.3)
    S_hat: Any   # minibatch output statistics, per layer (noisy_kfac.3)
    nu: Any      # KL-clipping factor applied to P, 1 without clipping (noisy_kfac.10)
    A: Any       # running A_l after the step, (n_in + 1, n_in + 1) each (noisy_kfac.4)
    S: Any       # running S_l after the step, (n_out, n_out) each (noisy_kfac.4)


class NoisyKFACTraceInputs(NamedTuple):
    """Everything one traced Noisy K-FAC (or K-FAC) step consumes, and how it was drawn.

    Attributes
    ----------
    method : str
        "noisy-kfac" or "kfac".
    seed : int
        Seed of numpy.random.default_rng, the only source of the draws.
    model : MLP
        ``MLP([5, 4, 2], activation="tanh", likelihood="categorical")``, D = 34.
    X : numpy.ndarray of shape (N, N_FEATURES)
        The shipped training set.
    y : numpy.ndarray of shape (N,)
        Class labels in {0, 1} (float).
    idx : numpy.ndarray of shape (M,)
        Minibatch rows, rng.permutation(N)[:M].
    eps : numpy.ndarray of shape (D, S) or None
        Standard-normal draws; None for kfac.
    u : numpy.ndarray of shape (S, M) or None
        Uniform draws of the sampled labels (curvature "mc"), else None.
    probs : numpy.ndarray of shape (S, M, C) or None
        The predictive p[s] = model.predict(w_s, X_B) the labels are drawn from, else None.
    y_tilde : numpy.ndarray of shape (S, M) or None
        The sampled labels (int64), the inverse CDF of probs at u, else None.
    state : NoisyKFACState
        The starting state.
    cfg : NoisyKFACConfig
        The step's config.
    """
    method: str       # "noisy-kfac" | "kfac"
    seed: int         # of numpy.random.default_rng, the only source of the draws
    model: Any        # MLP([5, 4, 2], "tanh", "categorical"), D = 34
    X: np.ndarray     # (N, N_FEATURES) the shipped training set
    y: np.ndarray     # (N,) class labels in {0, 1}
    idx: np.ndarray   # (M,) minibatch rows, rng.permutation(N)[:M]
    eps: Any          # (D, S) standard-normal draws, or None for kfac
    u: Any            # (S, M) uniforms of the sampled labels, or None
    probs: Any        # (S, M, C) the predictive at the draws, or None
    y_tilde: Any      # (S, M) sampled labels, or None
    state: Any        # NoisyKFACState
    cfg: Any          # NoisyKFACConfig

    @property
    def batch(self) -> Batch:
        return Batch(self.X[self.idx], self.y[self.idx])


def _spd_factor(rng, n: int) -> np.ndarray:
    """B B^T / n + I / 2 with B = rng.standard_normal((n, n)): SPD, eigenvalues >= 1/2."""
    B = rng.standard_normal((n, n))
    return B @ B.T / n + 0.5 * np.eye(n)


def _sampled_labels(probs, u):
    """y[s, i] = min(#{c : cumsum(probs[s, i])_c <= u[s, i]}, C - 1): the inverse CDF."""
    C = probs.shape[-1]
    count = np.sum(np.cumsum(probs, axis=-1) <= u[..., None], axis=-1)
    return np.minimum(count, C - 1).astype(np.int64)


def make_noisy_kfac_inputs(method: str, *, seed: int = 0, M: int = 8, S: int | None = None,
                           curvature: str = "ggn", damping: str = "factored",
                           kl_clip: float | None = None) -> NoisyKFACTraceInputs:
    """Build the problem, the starting state and the draws of one traced Noisy K-FAC step.

    The draws are made in the module docstring's order; kfac draws no eps and takes S = 1.

    Parameters
    ----------
    method : {"noisy-kfac", "kfac"}
        The traced step (kfac: eps = None).
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int or None, default None
        Draws of the weights, >= 1 (None: 2); kfac draws none and takes None or 1.
    curvature : {"ggn", "ef", "mc"}, default "ggn"
        Output-factor statistics; "mc" draws the sampled labels.
    damping : {"factored", "exact"}, default "factored"
        The damping of the sampler and the solve.
    kl_clip : float or None, default None
        The KL-clipping bound kappa > 0 (noisy_kfac.10), or None for no clipping.

    Returns
    -------
    NoisyKFACTraceInputs
        The problem, state, config and draws.

    Raises
    ------
    ValueError
        If method is not noisy-kfac or kfac, or an option is outside its range.
    """
    method = _check_method(method)
    if method not in KFAC_METHODS:
        raise ValueError(f"method: make_noisy_kfac_inputs traces {', '.join(KFAC_METHODS)}; "
                         f"use {_BUILDER[method]} for {method!r}")
    seed = check_int(seed, "seed", low=0)
    N = N_ROWS
    M = check_int(M, "M", low=1, high=N)
    if method == "kfac":
        if S not in (None, 1):
            raise ValueError(f"S: kfac draws no weights (eps = None, S = 1), got {S!r}")
        S = 1
    else:
        S = check_int(2 if S is None else S, "S", low=1)
    curvature = _one_of(curvature, "curvature", noisy_kfac.CURVATURES, method)
    damping = _one_of(damping, "damping", noisy_kfac.DAMPINGS, method)
    if kl_clip is not None:
        kl_clip = check_in_range(kl_clip, "kl_clip", 0.0, math.inf, low_open=True,
                                 high_open=True)
    X, y, _ = make_logistic_regression(N, N_FEATURES, PROBLEM_SEED)
    model = MLP(list(NK_SIZES), activation=NK_ACTIVATION, likelihood="categorical")
    cfg = noisy_kfac.NoisyKFACConfig(N, damping=damping, curvature=curvature, kl_clip=kl_clip,
                                     **NK_CONFIG)
    blocks = noisy_kfac.layer_slices(model)
    D = model.D

    rng = np.random.default_rng(seed)
    mu = NK_MEAN_SCALE * rng.standard_normal(D)
    m = NK_MOMENTUM_SCALE * rng.standard_normal(D)
    A = tuple(_spd_factor(rng, n_in) for _, _, n_in, _ in blocks)
    Sf = tuple(_spd_factor(rng, n_out) for _, _, _, n_out in blocks)
    idx = epoch_batches(rng, N, M)[0]
    eps = rng.standard_normal((D, S)) if method == "noisy-kfac" else None
    state = noisy_kfac.NoisyKFACState(mu, m, A, Sf, A, Sf, 0)
    u = probs = y_tilde = None
    if curvature == "mc":
        u = rng.random((S, M))
        w = mu[:, None] if eps is None else noisy_kfac.sample(state, eps, cfg, model)
        X_B = X[idx]
        probs = np.stack([model.predict(w[:, s], X_B) for s in range(S)])
        y_tilde = _sampled_labels(probs, u)
    return NoisyKFACTraceInputs(method, seed, model, X, y, idx, eps, u, probs, y_tilde, state,
                                cfg)


def trace_noisy_kfac(inputs: NoisyKFACTraceInputs) -> NoisyKFACTraceInfo:
    """Take the traced step by a direct call of ``noisy_kfac.step``, and collect its intermediates.

    pi from ``linalg.kron.factored_damping_pi`` of the state's A_ref, S_ref (factored damping);
    w .. nu are the step's ``NoisyKFACInfo``; A and S the new state's running factors.

    Parameters
    ----------
    inputs : NoisyKFACTraceInputs
        From ``make_noisy_kfac_inputs``.

    Returns
    -------
    NoisyKFACTraceInfo
        The intermediates, in the printed order.
    """
    state, cfg = inputs.state, inputs.cfg
    new, info = noisy_kfac.step(state, inputs.batch, inputs.eps, cfg, inputs.model,
                                y_tilde=inputs.y_tilde)
    pi = None
    if cfg.damping == "factored":
        pi = np.array([float(kron.factored_damping_pi(A, S))  # (noisy_kfac.5)
                       for A, S in zip(state.A_ref, state.S_ref)])
    return NoisyKFACTraceInfo(pi, *info, A=new.A, S=new.S)


# ----------------------------------------------------------------------------- the k-tied Normal

class KTiedTraceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace ktied``, in the printed order.

    The fields sigma .. rho are those of ``ktied.KTiedInfo``; m and v are the new state's Adam
    moments, so that mu, rho, m and v are the whole new state (with t = 1 and the same k).

    Attributes
    ----------
    sigma : array of shape (D,)
        Standard deviations, vec(U_l V_l^T) and softplus(r^b_l) in theta's order.  (ktied.1)
    theta : array of shape (D, S)
        Draws theta_s = mu + sigma * eps_s.  (ktied.2)
    g : array of shape (S, D)
        Summed minibatch gradients g_s = sum_{i in B} grad l_i(theta_s).  (bbb.4)
    g_hat : array of shape (D,)
        Data gradient in mu, (N / (M S)) sum_s g_s.  (bbb.5)
    g_sigma : array of shape (D,)
        Data gradient in sigma, (N / (M S)) sum_s g_s * eps_s.  (ktied.5)
    kl : array of shape ()
        KL(q || p).  (ktied.4)
    grad_mu : array of shape (D,)
        Objective gradient dF/dmu = g_hat + kl_weight * lam * mu.  (bbb.9)
    grad_sigma : array of shape (D,)
        Objective gradient dF/dsigma = g_sigma + kl_weight * (lam sigma - 1 / sigma).  (ktied.5)
    grad_rho : array of shape (P,)
        Objective gradient dF/drho through A = U V^T and the softplus.  (ktied.6)
    loss_hat : array of shape ()
        Data-term estimate (N / (M S)) sum_s sum_{i in B} l_i(theta_s).  (ktied.3)
    elbo : array of shape ()
        ELBO estimate -(loss_hat + kl_weight * kl).  (ktied.3)
    delta : array of shape (D + P,)
        Adam step on [mu; rho].  (ktied.7)
    mu : array of shape (D,)
        Mean mu_{t+1}.  (ktied.7)
    rho : array of shape (P,)
        Scale parameters rho_{t+1}.  (ktied.7)
    m : array of shape (D + P,)
        The new state's Adam first moment of [mu; rho].  (adam.1)
    v : array of shape (D + P,)
        The new state's Adam second moment of [mu; rho].  (adam.2)
    """
    sigma: Any       # vec(U V^T), softplus(r^b), (D,)  (ktied.1)
    theta: Any       # theta_s = mu + sigma * eps_s, (D, S)  (ktied.2)
    g: Any           # g_s = sum_{i in B} grad l_i(theta_s), (S, D)  (bbb.4)
    g_hat: Any       # (N / (M S)) sum_s g_s, (D,)  (bbb.5)
    g_sigma: Any     # (N / (M S)) sum_s g_s * eps_s, (D,)  (ktied.5)
    kl: Any          # KL(q || p), 0-d  (ktied.4)
    grad_mu: Any     # g_hat + kl_weight lam mu, (D,)  (bbb.9)
    grad_sigma: Any  # g_sigma + kl_weight (lam sigma - 1 / sigma), (D,)  (ktied.5)
    grad_rho: Any    # dF/drho, (P,)  (ktied.6)
    loss_hat: Any    # (N / (M S)) sum_s sum_{i in B} l_i(theta_s), 0-d  (ktied.3)
    elbo: Any        # -(loss_hat + kl_weight kl), 0-d  (ktied.3)
    delta: Any       # Adam step on [mu; rho], (D + P,)  (ktied.7)
    mu: Any          # mu_{t+1}, (D,)  (ktied.7)
    rho: Any         # rho_{t+1}, (P,)  (ktied.7)
    m: Any           # the new state's m_{t+1} of [mu; rho], (D + P,)  (adam.1)
    v: Any           # the new state's v_{t+1} of [mu; rho], (D + P,)  (adam.2)


class KTiedTraceInputs(NamedTuple):
    """Everything one traced k-tied step consumes, and how it was drawn.

    Attributes
    ----------
    method : str
        "ktied".
    seed : int
        Seed of numpy.random.default_rng, the only source of the draws.
    model : MLP
        ``MLP([4, 5, 3], activation="tanh", likelihood="categorical")``, D = 43.
    X : numpy.ndarray of shape (N, 4)
        The training inputs of the module docstring's recipe.
    y : numpy.ndarray of shape (N,)
        Class labels in {0, 1, 2} (int64).
    xi : numpy.ndarray of shape (P,)
        Standard-normal draws of the start's jitter (ktied.8).
    idx : numpy.ndarray of shape (M,)
        Minibatch rows, rng.permutation(N)[:M].
    eps : numpy.ndarray of shape (D, S)
        Standard-normal draws of the step.
    state : KTiedState
        The starting state, ``ktied.init(mu, model, k, KT_SIGMA0, xi, KT_JITTER)``.
    cfg : KTiedConfig
        The step's config.
    """
    method: str       # "ktied"
    seed: int         # of numpy.random.default_rng, the only source of the draws
    model: Any        # MLP([4, 5, 3], "tanh", "categorical"), D = 43
    X: np.ndarray     # (N, 4) the recipe's inputs
    y: np.ndarray     # (N,) class labels in {0, 1, 2}
    xi: np.ndarray    # (P,) the start's jitter draws (ktied.8)
    idx: np.ndarray   # (M,) minibatch rows, rng.permutation(N)[:M]
    eps: np.ndarray   # (D, S) standard-normal draws
    state: Any        # KTiedState
    cfg: Any          # KTiedConfig

    @property
    def batch(self) -> Batch:
        return Batch(self.X[self.idx], self.y[self.idx])

    @property
    def layout(self):
        """``ktied.layout(model, state.k)``: where R^U_l, R^V_l, r^b_l sit in rho."""
        return ktied.layout(self.model, self.state.k)


def _ktied_problem():
    """(model, X, y) of the k-tied trace, by the module docstring's recipe."""
    prng = np.random.default_rng(KT_PROBLEM_SEED)
    n_in, _, n_out = KT_SIZES
    X = prng.standard_normal((KT_ROWS, n_in))
    W = prng.standard_normal((n_in, n_out))
    y = np.argmax(X @ W + prng.standard_normal((KT_ROWS, n_out)), axis=1).astype(np.int64)
    model = MLP(list(KT_SIZES), activation=KT_ACTIVATION, likelihood="categorical")
    return model, X, y


def make_ktied_inputs(method: str = "ktied", *, seed: int = 0, M: int = 8, S: int = 1,
                      k: int = 2) -> KTiedTraceInputs:
    """Build the problem, the starting state and the draws of one traced k-tied step.

    The draws are made in the module docstring's order: mu, xi (the start), idx, eps.

    Parameters
    ----------
    method : {"ktied"}, default "ktied"
        The traced step.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int, default 1
        Monte Carlo draws, >= 1.
    k : int, default 2
        The rank of every layer's tie, >= 1.

    Returns
    -------
    KTiedTraceInputs
        The problem, state, config and draws.

    Raises
    ------
    ValueError
        If method is not ktied or an option is outside its range.
    """
    method = _check_method(method)
    if method not in KTIED_METHODS:
        raise ValueError(f"method: make_ktied_inputs traces {', '.join(KTIED_METHODS)}; "
                         f"use {_BUILDER[method]} for {method!r}")
    seed = check_int(seed, "seed", low=0)
    N = KT_ROWS
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    k = check_int(k, "k", low=1)
    model, X, y = _ktied_problem()
    lay = ktied.layout(model, k)
    cfg = ktied.KTiedConfig(N=N, lam=KT_LAM)

    rng = np.random.default_rng(seed)
    mu = KT_MEAN_SCALE * rng.standard_normal(lay.D)
    xi = rng.standard_normal(lay.P)
    state = ktied.init(mu, model, k, sigma0=KT_SIGMA0, xi=xi, jitter=KT_JITTER)  # (ktied.8)
    idx = epoch_batches(rng, N, M)[0]
    eps = rng.standard_normal((lay.D, S))
    return KTiedTraceInputs(method, seed, model, X, y, xi, idx, eps, state, cfg)


def trace_ktied(inputs: KTiedTraceInputs) -> KTiedTraceInfo:
    """Take the traced step by a direct call of ``ktied.step``, and collect its intermediates.

    sigma .. rho are the step's ``KTiedInfo``; m and v the new state's Adam moments.

    Parameters
    ----------
    inputs : KTiedTraceInputs
        From ``make_ktied_inputs``.

    Returns
    -------
    KTiedTraceInfo
        The intermediates, in the printed order.
    """
    new, info = ktied.step(inputs.state, inputs.batch, inputs.eps, inputs.cfg, inputs.model)
    return KTiedTraceInfo(*info, m=new.adam.m, v=new.adam.v)


def _info(inputs):
    """The Info of a trace's inputs: the step's Info, or the Laplace, SWAG, Noisy K-FAC or
    k-tied intermediates."""
    if isinstance(inputs, LaplaceTraceInputs):
        return trace_laplace(inputs)
    if isinstance(inputs, SWAGTraceInputs):
        return trace_swag(inputs)
    if isinstance(inputs, NoisyKFACTraceInputs):
        return trace_noisy_kfac(inputs)
    if isinstance(inputs, KTiedTraceInputs):
        return trace_ktied(inputs)
    return step(inputs)[1]


# ----------------------------------------------------------------------------- printing

def tag_label(method: str, field: str) -> str:
    """Label a field by its Algorithm 1 line and equation tag, as printed.

    Parameters
    ----------
    method : str
        One of METHODS.
    field : str
        A field of the method's Info.

    Returns
    -------
    str
        E.g. 'line 7 (slang.4)', 'lines 7, 9 (slang.4)' or '(ngvi.12)'.
    """
    line, tag = TAGS[method][field]
    if line is None:
        return tag
    return f"{'lines' if ',' in line else 'line'} {line} {tag}"


def _format_float(precision):
    return lambda v: f"{v: .{precision}e}"  # sign column keeps entries aligned


def format_values(a, precision: int, full: bool = False) -> str:
    """Format the values of a scalar or array as printed in a trace block.

    Every entry when ``full`` or up to SHOW_ALL of them, else the first SHOW_FIRST (C order) and
    the Frobenius norm.

    Parameters
    ----------
    a : array_like
        A scalar or an array.
    precision : int
        Digits after the point (e-format); 16 round-trips float64.
    full : bool, default False
        Print every entry whatever the size.

    Returns
    -------
    str
        The text, possibly over several lines.
    """
    a = np.asarray(a)
    fmt = {"float_kind": _format_float(precision)}
    if a.ndim == 0:
        return fmt["float_kind"](float(a)) if a.dtype.kind == "f" else str(a)
    if full or a.size <= SHOW_ALL:
        return np.array2string(a, separator=", ", formatter=fmt, threshold=a.size + 1,
                               max_line_width=100)
    first = np.array2string(a.reshape(-1)[:SHOW_FIRST], separator=", ", formatter=fmt,
                            max_line_width=100)
    return (f"first {SHOW_FIRST} of {a.size} entries (C order): {first}\n"
            f"norm: {_format_float(precision)(float(np.linalg.norm(a.reshape(-1))))}")


def _shape(a) -> str:
    return str(tuple(np.shape(a)))


def _block(label: str, name: str, value, precision: int, full: bool = False) -> str:
    body = "\n".join("  " + line for line in format_values(value, precision, full).splitlines())
    return f"[{label}] {name} {_shape(value)}\n{body}"


def _draws_line(inputs: TraceInputs) -> str:
    D, L = inputs.state.mu.shape[0], inputs.L
    parts = [f"mu = 0.5 * rng.standard_normal({D})", f"U = 0.5 * rng.standard_normal(({D}, {L}))",
             f"d = rng.uniform(0.5, 1.5, {D})"]
    if inputs.state.t > 0:
        parts.append(f"g_bar = rng.standard_normal({D})")
    parts.append(f"idx = rng.permutation({inputs.X.shape[0]})[:{inputs.idx.shape[0]}]")
    if inputs.eps is not None:
        parts.append(f"eps = rng.standard_normal({inputs.eps.shape})")
    return f"rng = numpy.random.default_rng({inputs.seed}), in order: " + "; ".join(parts)


def _state_start(inputs: TraceInputs) -> str:
    if inputs.method == "slang":
        return "SLANGState(mu, U, d, g_bar, t)"
    if inputs.method == "ngvi-full":
        return "FullState(mu, Sigma_inv = U U^T + diag(d), g_bar, t)"
    return "MeanFieldState(mu, prec_diag = d + sum_j U_j^2, g_bar, t)"


def _cfg_text(cfg) -> str:
    fields = ", ".join(f"{k}={v!r}" for k, v in cfg._asdict().items() if k != "lam")
    return f"{type(cfg).__name__}(lam=cfg.lam, {fields})"


def _inputs(inputs: TraceInputs) -> list[tuple[str, Any]]:
    """(name, value) of everything the step consumes, in the printed order."""
    batch = inputs.batch
    rows = [("idx", inputs.idx), ("batch.X", batch.X), ("batch.y", batch.y)]
    if inputs.eps is not None:
        rows.append(("eps", inputs.eps))
    rows += [(f"state.{k}", v) for k, v in inputs.state._asdict().items() if k != "t"]
    rows.append(("cfg.lam", inputs.cfg.lam))
    return rows


def _map_line(found: MAPResult) -> str:
    lbfgs = ", ".join(f"{k}={v!r}" for k, v in MAP_LBFGS.items())
    return (f"theta0 = model.init_theta(numpy.random.default_rng({MAP_INIT_SEED})); "
            f"scipy.optimize.minimize(L-BFGS-B, jac=grad L, {lbfgs}): nit = {found.lbfgs_nit}; "
            f"then {found.newton_steps} Newton steps (model.hessian + diag(delta), at most "
            f"{MAX_NEWTON}, each kept only if it reduces |grad L|_2); "
            f"|grad L(theta_map)|_2 = {found.grad_norm!r} (MAP_GTOL = {MAP_GTOL:g})")


def _format_laplace_trace(inputs: LaplaceTraceInputs, info, precision: int) -> str:
    method, model, D = inputs.method, inputs.model, inputs.model.D
    if method == "laplace":
        what = ("laplace.fit, sample, log_marginal_likelihood and glm_predictive of "
                "refbayes.methods.laplace at the MAP")
    else:
        what = ("laplace.fit and sample, then riemannian_laplace.velocities, sample and "
                "squared_speed of refbayes.methods.riemannian_laplace at the MAP")
    lines = [
        f"refbayes trace {method}: {what}",
        (f"problem: prng = numpy.random.default_rng({LA_PROBLEM_SEED}); X = prng.uniform(-3.0, "
         f"3.0, ({LA_ROWS}, 1)); y = sin(X[:, 0]) + prng.standard_normal({LA_ROWS}) / "
         f"sqrt({LA_NOISE_PRECISION!r}); {model!r}; D = {D}, N = {inputs.X.shape[0]}; "
         f"test inputs X_star = numpy.linspace(-3.0, 3.0, {LA_TEST_INPUTS})[:, None]"),
        (f"objective: L(theta) = sum_i l_i(theta) + (1/2) theta^T diag(delta) theta, "
         f"delta = prior_precision = {inputs.cfg.prior_precision!r} on every parameter"),
        f"config: {inputs.cfg!r}",
    ]
    if inputs.ode is not None:
        lines.append(f"ode: {inputs.ode!r}; grad_fn, hvp_fn = riemannian_laplace.loss_fns(model, "
                     "X, y, delta): model.grad(theta, X, y) + delta theta, "
                     "model.hvp(theta, u, X, y) + delta u")
    lines += [
        f"map: {_map_line(inputs.map)}",
        (f"draws: rng = numpy.random.default_rng({inputs.seed}), in order: "
         f"eps = rng.standard_normal({inputs.eps.shape})"),
        "",
    ]
    for name, value in [("X", inputs.X), ("y", inputs.y), ("X_star", inputs.X_star),
                        ("theta_map", inputs.map.theta_map), ("eps", inputs.eps)]:
        lines += [_block("input", name, value, precision, full=True), ""]
    lines.append(f"{type(info).__name__}, in order:")
    for field, value in info._asdict().items():
        lines += [_block(tag_label(method, field), field, value, precision), ""]
    return "\n".join(lines).rstrip() + "\n"


def _swag_config_lines(inputs: SWAGTraceInputs) -> list[str]:
    sgd, N = inputs.sgd, inputs.X.shape[0]
    return [
        (f"config: {sgd!r}, i.e. torch.optim.SGD(lr={N * sgd.alpha!r}, "
         f"momentum={sgd.momentum!r}, weight_decay={sgd.lam / N!r}) on the mean loss"),
        f"config: SWAG {inputs.cfg!r}; SWAG-Diagonal {inputs.diag_cfg!r}",
    ]


def _format_swag_trace(inputs: SWAGTraceInputs, info, precision: int) -> str:
    (T, M), (D, S), Kp = inputs.idx.shape, inputs.z1.shape, inputs.z2.shape[0]
    N = inputs.X.shape[0]
    lines = [
        (f"refbayes trace swag: {T} steps of refbayes.methods.swag.sgd_step, each followed by "
         "swag.collect; then diag_variance, deviations, dense_covariance, sample and "
         "log_density (SWAG), sample and log_density without the low-rank term "
         "(SWAG-Diagonal, the same z1)"),
        (f"problem: make_logistic_regression(n={N_ROWS}, p={N_FEATURES}, seed={PROBLEM_SEED}) "
         f"-> X {inputs.X.shape}, y {inputs.y.shape}; {inputs.model!r} (intercept last); "
         f"D = {D}, N = {N}; objective sum_i l_i(theta) + (lam / 2) |theta|^2, minibatch sums "
         f"scaled by N / M = {N} / {M}"),
        *_swag_config_lines(inputs),
        (f"start: swag.sgd_init(theta0) (v = 0, t = 0) and swag.init(theta0, cfg) (n = 0); a "
         f"snapshot collected after every step; K' = min(T, K) = {Kp}"),
        (f"draws: rng = numpy.random.default_rng({inputs.seed}), in order: "
         f"theta0 = 0.5 * rng.standard_normal({D}); for each of the {T} steps "
         f"rng.permutation({N})[:{M}] (row t of idx: step t + 1); "
         f"z1 = rng.standard_normal({(D, S)}); z2 = rng.standard_normal({(Kp, S)})"),
        "",
    ]
    for name in ("X", "y", "theta0", "idx", "z1", "z2"):
        lines += [_block("input", name, getattr(inputs, name), precision, full=True), ""]
    lines.append(f"{type(info).__name__}, in order (per-step fields: row t is step t + 1):")
    for field, value in info._asdict().items():
        lines += [_block(tag_label(inputs.method, field), field, value, precision), ""]
    return "\n".join(lines).rstrip() + "\n"


def _nk_blocks(label: str, name: str, value, precision: int, full: bool = False) -> list[str]:
    """The printed block(s) of one value: a tuple (one array per layer) as name[0], name[1], ..."""
    if isinstance(value, tuple):
        return [line for l, v in enumerate(value)
                for line in (_block(label, f"{name}[{l}]", v, precision, full), "")]
    return [_block(label, name, value, precision, full), ""]


def _nk_sampler_line(inputs: NoisyKFACTraceInputs) -> str:
    if inputs.eps is None:
        return "sampler: none (kfac: eps = None, w = mu as one column)"
    head = ("sampler (noisy_kfac.6)-(noisy_kfac.7), per layer from A_ref, S_ref, with "
            "E_s = eps[start:stop, s].reshape(n_in + 1, n_out) (row-major) and the mean's block "
            "M: ")
    if inputs.cfg.damping == "factored":
        return head + ("W_s = M + sqrt(kl_weight / N) L_A^{-T} E_s L_S^{-1}, L_A, L_S the lower "
                       "Cholesky factors of A_ref + pi sqrt(gamma_in) I and S_ref + "
                       "(sqrt(gamma_in) / pi) I")
    return head + ("W_s = M + sqrt(kl_weight / N) Q_A ((Q_A^T E_s Q_S) / sqrt(Lam)) Q_S^T, the "
                   "symmetric square root (independent of the eigenvectors' signs), "
                   "Lam[i, j] = lam_A[i] lam_S[j] + gamma_in")


def _nk_draws_line(inputs: NoisyKFACTraceInputs) -> str:
    D, N, M = inputs.model.D, inputs.X.shape[0], inputs.idx.shape[0]
    A_shapes = ", ".join(f"A_{l + 1} {F.shape}" for l, F in enumerate(inputs.state.A))
    S_shapes = ", ".join(f"S_{l + 1} {F.shape}" for l, F in enumerate(inputs.state.S))
    parts = [f"mu = {NK_MEAN_SCALE!r} * rng.standard_normal({D})",
             f"m = {NK_MOMENTUM_SCALE!r} * rng.standard_normal({D})",
             (f"{A_shapes}, then {S_shapes}, each B @ B.T / n + I / 2 with "
              "B = rng.standard_normal((n, n))"),
             f"idx = rng.permutation({N})[:{M}]"]
    if inputs.eps is not None:
        parts.append(f"eps = rng.standard_normal({inputs.eps.shape})")
    if inputs.u is not None:
        parts.append(f"u = rng.random({inputs.u.shape}), then y_tilde[s, i] = "
                     "min(#{c : cumsum(probs[s, i])_c <= u[s, i]}, C - 1) with "
                     "probs[s] = model.predict(w_s, batch.X) at the step's draws w")
    return f"rng = numpy.random.default_rng({inputs.seed}), in order: " + "; ".join(parts)


def _format_noisy_kfac_trace(inputs: NoisyKFACTraceInputs, info, precision: int) -> str:
    method, cfg, state, model = inputs.method, inputs.cfg, inputs.state, inputs.model
    g_in = noisy_kfac.gamma_in(cfg)
    layers = "; ".join(f"layer {l + 1}: theta[{a}:{b}], A_{l + 1} ({n}, {n}), "
                       f"S_{l + 1} ({k}, {k})"
                       for l, (a, b, n, k) in enumerate(noisy_kfac.layer_slices(model)))
    what = ("eps = None: K-FAC, everything at the mean" if inputs.eps is None
            else "the draws from eps")
    lines = [
        f"refbayes trace {method}: one step of refbayes.methods.noisy_kfac.step ({what})",
        (f"problem: make_logistic_regression(n={N_ROWS}, p={N_FEATURES}, seed={PROBLEM_SEED}) "
         f"-> X {inputs.X.shape}, y {inputs.y.shape} (labels 0, 1: two classes); {model!r}; "
         f"D = {model.D}, N = {inputs.X.shape[0]}; {layers}"),
        (f"config: {cfg!r}; gamma_in = kl_weight / (N eta) = {g_in!r}, "
         f"gamma = gamma_in + gamma_ex = {g_in + cfg.gamma_ex!r}"),
        (f"start: NoisyKFACState(mu, m, A, S, A_ref = A, S_ref = S, t = {state.t}); "
         "the statistics (T_stats = 1) and the refresh (T_inv = 1) happen at this step"),
        f"draws: {_nk_draws_line(inputs)}",
        _nk_sampler_line(inputs),
        "",
    ]
    if inputs.eps is None:
        lines += ["[input] eps: none (kfac: the step at the mean)", ""]
    batch = inputs.batch
    rows = [("idx", inputs.idx), ("batch.X", batch.X), ("batch.y", batch.y)]
    rows += [(name, getattr(inputs, name)) for name in ("eps", "u", "probs", "y_tilde")
             if getattr(inputs, name) is not None]
    rows += [("state.mu", state.mu), ("state.m", state.m), ("state.A", state.A),
             ("state.S", state.S)]
    for name, value in rows:  # in full, whatever their size: they are to be fed back
        lines += _nk_blocks("input", name, value, precision, full=True)
    lines.append(f"{type(info).__name__}, in order (name[l] is layer l + 1's):")
    for field, value in info._asdict().items():
        label = tag_label(method, field)
        if value is None:
            lines += [f"[{label}] {field}: none (damping {cfg.damping!r} has no split)", ""]
        else:
            lines += _nk_blocks(label, field, value, precision)
    return "\n".join(lines).rstrip() + "\n"


def _kt_layout_line(inputs: KTiedTraceInputs) -> str:
    lay = inputs.layout
    parts = []
    for l in range(len(lay.k)):
        m, n, c = lay.sizes[l], lay.sizes[l + 1], lay.k[l]
        w, b = lay.w_theta[l], lay.b_theta[l]
        u, v, r = lay.u_off[l], lay.v_off[l], lay.b_off[l]
        i = l + 1
        parts.append(f"layer {i}: W_{i} theta[{w}:{w + m * n}] ({m}, {n}), b_{i} "
                     f"theta[{b}:{b + n}]; R^U_{i} rho[{u}:{u + m * c}] ({m}, {c}), R^V_{i} "
                     f"rho[{v}:{v + n * c}] ({n}, {c}), r^b_{i} rho[{r}:{r + n}] (row-major)")
    return (f"layout: ktied.layout(model, k={lay.k}), D = {lay.D}, P = {lay.P}; "
            + "; ".join(parts))


def _format_ktied_trace(inputs: KTiedTraceInputs, info, precision: int) -> str:
    method, cfg, state, model = inputs.method, inputs.cfg, inputs.state, inputs.model
    lay = inputs.layout
    N, M, (D, S) = inputs.X.shape[0], inputs.idx.shape[0], inputs.eps.shape
    n_in, _, n_out = KT_SIZES
    counts = ", ".join(str(int(c)) for c in np.bincount(inputs.y, minlength=n_out))
    fields = ", ".join(f"{k}={v!r}" for k, v in cfg._asdict().items())
    lines = [
        f"refbayes trace {method}: one step of refbayes.methods.ktied.step",
        (f"problem: prng = numpy.random.default_rng({KT_PROBLEM_SEED}); X = prng.standard_normal("
         f"({KT_ROWS}, {n_in})); W = prng.standard_normal(({n_in}, {n_out})); y = argmax(X @ W + "
         f"prng.standard_normal(({KT_ROWS}, {n_out})), axis=1) (int64; class counts {counts}); "
         f"{model!r}; D = {D}, N = {N}"),
        _kt_layout_line(inputs),
        (f"config: KTiedConfig = BBBConfig({fields}); prior N(0, I / lam); objective (ktied.3) "
         f"F_hat = (N / (M S)) sum_s sum_{{i in B}} l_i(theta_s) + kl_weight KL(q || p), "
         f"N / (M S) = {N} / ({M} * {S})"),
        (f"start: ktied.init(mu, model, k={lay.k}, sigma0={KT_SIGMA0!r}, xi, "
         f"jitter={KT_JITTER!r}) (ktied.8): rho = softplus^{{-1}}(c) + {KT_JITTER!r} xi, "
         f"c = sqrt(sigma0 / k_l) on R^U_l, R^V_l (U_l V_l^T = sigma0 before the jitter) and "
         f"sigma0 on r^b_l; zero Adam moments m, v of [mu; rho] (D + P = {D + lay.P} entries "
         f"each), t = {state.t}"),
        (f"draws: rng = numpy.random.default_rng({inputs.seed}), in order: "
         f"mu = {KT_MEAN_SCALE!r} * rng.standard_normal({D}); xi = rng.standard_normal({lay.P}); "
         f"idx = rng.permutation({N})[:{M}]; eps = rng.standard_normal({(D, S)})"),
        (f"new state: KTiedState(mu, rho, AdamState(m, v, {state.t + 1}), t = {state.t + 1}, "
         f"k = {lay.k}), mu, rho, m and v printed below"),
        "",
    ]
    factors = ktied.scale_parameters(state, model)  # (ktied.1)
    batch = inputs.batch
    rows = [("idx", inputs.idx), ("batch.X", batch.X), ("batch.y", batch.y), ("xi", inputs.xi),
            ("eps", inputs.eps), ("state.mu", state.mu), ("state.rho", state.rho)]
    for l, (U, V, sigma_b) in enumerate(factors):  # layer by layer: U[l], V[l], sigma_b[l]
        rows += [(f"state.U[{l}]", U), (f"state.V[{l}]", V), (f"state.sigma_b[{l}]", sigma_b)]
    for name, value in rows:  # in full, whatever their size: they are to be fed back
        lines += [_block("input", name, value, precision, full=True), ""]
    lines.append(f"{type(info).__name__}, in order (m, v: the new state's Adam moments of "
                 "[mu; rho]):")
    for field, value in info._asdict().items():
        lines += [_block(tag_label(method, field), field, value, precision), ""]
    return "\n".join(lines).rstrip() + "\n"


def format_trace(inputs, info, precision: int = 8) -> str:
    """Format the printed trace: header, inputs and draws, then one block per Info field.

    Parameters
    ----------
    inputs : NamedTuple
        TraceInputs, LaplaceTraceInputs, SWAGTraceInputs, NoisyKFACTraceInputs or
        KTiedTraceInputs, from ``make_inputs``, ``make_laplace_inputs``,
        ``make_swag_inputs``, ``make_noisy_kfac_inputs`` or ``make_ktied_inputs``.
    info : NamedTuple
        The matching Info (``step(inputs)[1]``, ``trace_laplace(inputs)``,
        ``trace_swag(inputs)``, ``trace_noisy_kfac(inputs)`` or ``trace_ktied(inputs)``).
    precision : int, default 8
        Digits after the point; 16 round-trips float64.

    Returns
    -------
    str
        The trace, ending with a newline.
    """
    if isinstance(inputs, LaplaceTraceInputs):
        return _format_laplace_trace(inputs, info, precision)
    if isinstance(inputs, SWAGTraceInputs):
        return _format_swag_trace(inputs, info, precision)
    if isinstance(inputs, NoisyKFACTraceInputs):
        return _format_noisy_kfac_trace(inputs, info, precision)
    if isinstance(inputs, KTiedTraceInputs):
        return _format_ktied_trace(inputs, info, precision)
    method, state = inputs.method, inputs.state
    fn = STEPS[method]
    lines = [
        f"refbayes trace {method}: one step of {fn.__module__}.{fn.__name__}",
        (f"problem: make_logistic_regression(n={N_ROWS}, p={N_FEATURES}, seed={PROBLEM_SEED}) "
         f"-> X {inputs.X.shape}, y {inputs.y.shape}; {inputs.model!r} (intercept last); "
         f"D = {state.mu.shape[0]}, N = {inputs.X.shape[0]}"),
        f"config: {_cfg_text(inputs.cfg)}",
        f"start: {_state_start(inputs)} with t = {state.t}",
        f"draws: {_draws_line(inputs)}",
        "",
    ]
    if inputs.eps is None:
        lines += ["[input] eps: none (curvature 'exact' takes expectations by quadrature)", ""]
    for name, value in _inputs(inputs):  # in full, whatever their size: they are to be fed back
        lines += [_block("input", name, value, precision, full=True), ""]
    lines.append(f"{type(info).__name__}, in order:")
    for field, value in info._asdict().items():
        lines += [_block(tag_label(method, field), field, value, precision), ""]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- JSON

def _jsonable(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, tuple):  # one array per layer (Noisy K-FAC's factors)
        return [_jsonable(x) for x in v]
    return v


def _json_shape(value):
    """The shape as a list; per layer for a tuple of arrays; None for a value that is None."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return [list(np.shape(v)) for v in value]
    return list(np.shape(value))


def _info_json(method: str, info) -> dict:
    return {field: {"line": TAGS[method][field][0], "tag": TAGS[method][field][1],
                    "shape": _json_shape(value), "value": _jsonable(value)}
            for field, value in info._asdict().items()}


def _laplace_json(inputs: LaplaceTraceInputs, info) -> dict:
    found = inputs.map
    return {
        "method": inputs.method,
        "seed": inputs.seed,
        "problem": {"recipe": ("prng = numpy.random.default_rng(seed); X = prng.uniform(-3.0, "
                               "3.0, (n, 1)); y = sin(X[:, 0]) + prng.standard_normal(n) / "
                               "sqrt(noise_precision)"),
                    "n": LA_ROWS, "seed": LA_PROBLEM_SEED,
                    "noise_precision": LA_NOISE_PRECISION,
                    "model": {"class": "refbayes.models.MLP",
                              "sizes": list(inputs.model.sizes), "activation": "tanh",
                              "likelihood": "gaussian",
                              "noise_precision": LA_NOISE_PRECISION},
                    "X": inputs.X.tolist(), "y": inputs.y.tolist(),
                    "X_star": inputs.X_star.tolist()},
        "config": {k: _jsonable(v) for k, v in inputs.cfg._asdict().items()},
        "ode": None if inputs.ode is None else dict(inputs.ode._asdict()),
        "map": {"theta_map": found.theta_map.tolist(), "theta0": found.theta0.tolist(),
                "init_seed": MAP_INIT_SEED, "lbfgs": dict(MAP_LBFGS),
                "lbfgs_nit": found.lbfgs_nit, "newton_steps": found.newton_steps,
                "max_newton": MAX_NEWTON, "grad_norm": found.grad_norm, "gtol": MAP_GTOL},
        "draws": {"eps": inputs.eps.tolist()},
        "info": _info_json(inputs.method, info),
    }


def _swag_json(inputs: SWAGTraceInputs, info) -> dict:
    def config(cfg):
        return {k: _jsonable(v) for k, v in cfg._asdict().items()}
    return {
        "method": inputs.method,
        "seed": inputs.seed,
        "problem": {"generator": "refbayes.datasets.make_logistic_regression",
                    "n": N_ROWS, "p": N_FEATURES, "seed": PROBLEM_SEED, "intercept": "last",
                    "X": inputs.X.tolist(), "y": inputs.y.tolist()},
        "config": {"steps": int(inputs.idx.shape[0]), "sgd": config(inputs.sgd),
                   "swag": config(inputs.cfg), "swag_diagonal": config(inputs.diag_cfg)},
        "draws": {"theta0": inputs.theta0.tolist(), "idx": inputs.idx.tolist(),
                  "z1": inputs.z1.tolist(), "z2": inputs.z2.tolist()},
        "info": _info_json(inputs.method, info),
    }


def _noisy_kfac_json(inputs: NoisyKFACTraceInputs, info) -> dict:
    cfg = inputs.cfg
    g_in = noisy_kfac.gamma_in(cfg)
    return {
        "method": inputs.method,
        "seed": inputs.seed,
        "problem": {"generator": "refbayes.datasets.make_logistic_regression",
                    "n": N_ROWS, "p": N_FEATURES, "seed": PROBLEM_SEED,
                    "model": {"class": "refbayes.models.MLP", "sizes": list(NK_SIZES),
                              "activation": NK_ACTIVATION, "likelihood": "categorical"},
                    "layers": [list(b) for b in noisy_kfac.layer_slices(inputs.model)],
                    "X": inputs.X.tolist(), "y": inputs.y.tolist()},
        "config": {k: _jsonable(v) for k, v in cfg._asdict().items()},
        "derived": {"gamma_in": g_in, "gamma": g_in + cfg.gamma_ex},
        "draws": {name: _jsonable(getattr(inputs, name))
                  for name in ("idx", "eps", "u", "probs", "y_tilde")},
        "state": {k: _jsonable(v) for k, v in inputs.state._asdict().items()},
        "info": _info_json(inputs.method, info),
    }


def _kt_state_json(state) -> dict:
    return {"mu": state.mu.tolist(), "rho": state.rho.tolist(),
            "adam": {"m": state.adam.m.tolist(), "v": state.adam.v.tolist(),
                     "t": int(state.adam.t)},
            "t": int(state.t), "k": list(state.k)}


def _ktied_json(inputs: KTiedTraceInputs, info) -> dict:
    state, lay = inputs.state, inputs.layout
    new = ktied.KTiedState(info.mu, info.rho, AdamState(info.m, info.v, state.adam.t + 1),
                           state.t + 1, state.k)
    factors = ktied.scale_parameters(state, inputs.model)  # (ktied.1)
    return {
        "method": inputs.method,
        "seed": inputs.seed,
        "problem": {"recipe": ("prng = numpy.random.default_rng(seed); X = "
                               "prng.standard_normal((n, n_in)); W = prng.standard_normal((n_in, "
                               "n_out)); y = argmax(X @ W + prng.standard_normal((n, n_out)), "
                               "axis=1)"),
                    "n": KT_ROWS, "seed": KT_PROBLEM_SEED,
                    "model": {"class": "refbayes.models.MLP", "sizes": list(KT_SIZES),
                              "activation": KT_ACTIVATION, "likelihood": "categorical"},
                    "layout": {f: (list(v) if isinstance(v, tuple) else v)
                               for f, v in lay._asdict().items()},
                    "X": inputs.X.tolist(), "y": inputs.y.tolist()},
        "config": {k: _jsonable(v) for k, v in inputs.cfg._asdict().items()},
        "init": {"mean_scale": KT_MEAN_SCALE, "k": list(state.k), "sigma0": KT_SIGMA0,
                 "jitter": KT_JITTER},
        "draws": {"mu": state.mu.tolist(), "xi": inputs.xi.tolist(),
                  "idx": inputs.idx.tolist(), "eps": inputs.eps.tolist()},
        "state": _kt_state_json(state),
        "factors": [{"U": U.tolist(), "V": V.tolist(), "sigma_b": _jsonable(b)}
                    for U, V, b in factors],
        "info": _info_json(inputs.method, info),
        "new_state": _kt_state_json(new),
    }


def to_json(inputs, info) -> dict:
    """Collect the inputs, draws and every Info field as JSON-ready data.

    Arrays become nested lists; Python floats are written by ``json`` with repr, so they
    round-trip exactly.

    Parameters
    ----------
    inputs : NamedTuple
        TraceInputs, LaplaceTraceInputs, SWAGTraceInputs, NoisyKFACTraceInputs or
        KTiedTraceInputs, from ``make_inputs``, ``make_laplace_inputs``,
        ``make_swag_inputs``, ``make_noisy_kfac_inputs`` or ``make_ktied_inputs``.
    info : NamedTuple
        The matching Info.

    Returns
    -------
    dict
        Keys method, seed, problem, config, draws, info (and state for the step methods;
        ode and map for the Laplace methods). For swag, config holds steps and the sgd, swag
        and swag_diagonal configs, and draws theta0, idx (T, M), z1 and z2. For noisy-kfac and
        kfac, derived holds gamma_in and gamma, draws idx, eps, u, probs and y_tilde (None
        where not drawn), the state's factors and the info's tuples are lists with one matrix
        per layer (their shape a list of shapes), and pi is None for exact damping. For ktied,
        problem also holds the model and ktied.layout, init the start's mean_scale, k, sigma0
        and jitter, draws mu, xi, idx and eps, state and new_state the whole KTiedState (mu,
        rho, adam {m, v, t}, t, k), and factors the positive U, V and sigma_b of each layer.
    """
    if isinstance(inputs, LaplaceTraceInputs):
        return _laplace_json(inputs, info)
    if isinstance(inputs, SWAGTraceInputs):
        return _swag_json(inputs, info)
    if isinstance(inputs, NoisyKFACTraceInputs):
        return _noisy_kfac_json(inputs, info)
    if isinstance(inputs, KTiedTraceInputs):
        return _ktied_json(inputs, info)
    cfg = {k: _jsonable(v) for k, v in inputs.cfg._asdict().items()}
    return {
        "method": inputs.method,
        "seed": inputs.seed,
        "problem": {"generator": "refbayes.datasets.make_logistic_regression",
                    "n": N_ROWS, "p": N_FEATURES, "seed": PROBLEM_SEED, "intercept": "last",
                    "X": inputs.X.tolist(), "y": inputs.y.tolist()},
        "config": cfg,
        "draws": {"idx": inputs.idx.tolist(),
                  "eps": None if inputs.eps is None else inputs.eps.tolist()},
        "state": {k: _jsonable(v) for k, v in inputs.state._asdict().items()},
        "info": _info_json(inputs.method, info),
    }


# ----------------------------------------------------------------------------- command line

# option dest -> {method it applies to: its default there}; None in the parser means "not given",
# so an option given for a method it does not apply to is an error, not ignored.
OPTIONS: dict[str, dict[str, Any]] = {
    "S": {**dict.fromkeys(STEP_METHODS, 1), **dict.fromkeys(LAPLACE_METHODS, 2),
          **dict.fromkeys(SWAG_METHODS, 2), "noisy-kfac": 2,
          **dict.fromkeys(KTIED_METHODS, 1)},
    "curvature": {**dict.fromkeys(STEP_METHODS, "ef"), **dict.fromkeys(LAPLACE_METHODS, "ggn"),
                  **dict.fromkeys(KFAC_METHODS, "ggn")},
    "M": dict.fromkeys(STEP_METHODS + SWAG_METHODS + KFAC_METHODS + KTIED_METHODS, 8),
    "L": dict.fromkeys(STEP_METHODS, 2),
    "momentum": {**dict.fromkeys(STEP_METHODS, 0.0), **dict.fromkeys(SWAG_METHODS, 0.9)},
    "t": dict.fromkeys(STEP_METHODS, 0),
    "prior_precision": dict.fromkeys(LAPLACE_METHODS, 1.0),
    "structure": dict.fromkeys(LAPLACE_METHODS, "full"),
    "subset": dict.fromkeys(LAPLACE_METHODS, "all"),
    "ode_method": {"riemannian-laplace": "RK45"},
    "rtol": {"riemannian-laplace": 1e-6},
    "atol": {"riemannian-laplace": 1e-3},
    "K": dict.fromkeys(SWAG_METHODS, 4),
    "scale": dict.fromkeys(SWAG_METHODS, 0.5),
    "alpha": dict.fromkeys(SWAG_METHODS, 2e-3),
    "damping": dict.fromkeys(KFAC_METHODS, "factored"),
    "kl_clip": dict.fromkeys(KFAC_METHODS, None),
    "k": dict.fromkeys(KTIED_METHODS, 2),
}
for _m in DRIVER_METHODS:  # their options and defaults are their golden.Tracer's
    for _dest, _default in golden.TRACERS[_m].options.items():
        OPTIONS[_dest][_m] = _default


# ----------------------------------------------------------------------------- golden traces

def _tag_table(method: str) -> dict:
    return {field: tag for field, (_, tag) in TAGS[method].items()}


def _step_chain(method: str, seed: int, **opts) -> golden.Chain:
    """slang, ngvi-full, ngvi-meanfield and ktied as a golden.Chain: step 1 is the printed
    trace's step, with its draws; later steps draw idx, then eps of the same shape."""
    if method in KTIED_METHODS:
        inputs = make_ktied_inputs(method, seed=seed, **opts)
        step_fn = ktied.step
    else:
        inputs = make_inputs(method, seed=seed, **opts)
        step_fn = STEPS[method]
    eps = inputs.eps

    def draws(rng, M):
        return (None if eps is None else rng.standard_normal(eps.shape)), {}

    return golden.Chain(inputs.state, inputs.cfg, inputs.model, inputs.X, inputs.y,
                        len(inputs.idx), step_fn, draws, None, _tag_table(method),
                        first=(inputs.idx, eps, {}))


def _fit_run(method: str):
    """A golden Tracer.run for the methods traced as one fit (Laplace, RLA, Noisy K-FAC, K-FAC)
    or one SGD run (swag, its T SGD steps the trace's ``steps``)."""
    def run(seed, steps, dtype, **opts):
        inputs = _printed_inputs(method, seed, steps, opts)
        info = _info(inputs)
        arrays, config = {}, {}
        for name, value in inputs._asdict().items():
            if name == "cfg":
                config = golden.scalars_of(value)
                arrays.update(golden.cfg_arrays(value))
            elif name == "map":  # the point, not how it was reached (iterations, |grad| at
                # rounding level: both move with the BLAS thread count)
                arrays.update({"input.map.theta_map": value.theta_map,
                               "input.map.theta0": value.theta0})
            elif name not in ("method", "seed", "model"):
                arrays.update(golden.arrays_of("input.", {name: value}))
        outputs = {n: a[None] for n, a in golden.arrays_of("", info).items()}
        table = _tag_table(method)
        tags = {n: table.get(n.split(".")[0], "") for n in outputs}
        return arrays, outputs, tags, config, golden.model_spec(inputs.model), set()
    return run


def _options(method: str) -> dict:
    return {dest: defaults[method] for dest, defaults in OPTIONS.items()
            if method in defaults}


def _chain_run(method: str):
    """A golden Tracer.run for the chained methods of this module."""
    def run(seed, steps, dtype, **opts):
        return golden.run_chain(_step_chain(method, seed, **opts), seed, steps, dtype)
    return run


_NOTES = {"slang": "slang", "ngvi-full": "ngvi", "ngvi-meanfield": "ngvi", "ktied": "ktied",
          "laplace": "laplace", "riemannian-laplace": "riemannian_laplace",
          "noisy-kfac": "noisy_kfac", "kfac": "noisy_kfac", "swag": "swag"}
for _m in STEP_METHODS + KTIED_METHODS:
    golden.register(golden.Tracer(_m, f"derivations/{_NOTES[_m]}.md", _chain_run(_m),
                                  _options(_m), sign_free=("U",) if _m == "slang" else ()))
for _m in LAPLACE_METHODS + KFAC_METHODS + SWAG_METHODS:
    golden.register(golden.Tracer(_m, f"derivations/{_NOTES[_m]}.md", _fit_run(_m), _options(_m),
                                  chained=_m in SWAG_METHODS, float32=False,
                                  default_steps=6 if _m in SWAG_METHODS else 1,
                                  absolute=(("g", MAP_GTOL),) if _m == "riemannian-laplace"
                                  else ()))


def format_golden(trace: golden.Trace, precision: int = 8) -> str:
    """Format a golden trace as printed: header, inputs, then each step's outputs by tag.

    Parameters
    ----------
    trace : golden.Trace
        From ``golden.build`` or ``golden.load``.
    precision : int, default 8
        Digits after the point; 16 round-trips float64.

    Returns
    -------
    str
        The trace, ending with a newline.
    """
    man = trace.manifest
    K = next(iter(trace.outputs.values())).shape[0]
    lines = [f"refbayes trace {trace.method}: {K} step(s), {man['options']['dtype']}; "
             f"equations in {man['derivation']}",
             f"command: {man['command']}",
             f"model: {man['model']['repr']}, D = {man['model']['D']}",
             "config: " + ", ".join(f"{k}={v!r}" for k, v in trace.config.items()),
             "draws: step 1 after the start from numpy.random.default_rng(seed); step k + 1 >= 2 "
             "from numpy.random.default_rng([seed, k]) (refbayes.golden)", ""]
    for name, value in trace.inputs.items():
        lines += [_block("input", name, value, precision, full=True), ""]
    for k in range(K):
        lines.append(f"step {k + 1}:")
        for name, value in trace.outputs.items():
            label = trace.tags.get(name) or "untagged"
            lines += [_block(label, name, value[k], precision), ""]
    return "\n".join(lines).rstrip() + "\n"


def add_arguments(parser) -> None:
    """Add the ``refbayes trace`` arguments to an argparse parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The ``trace`` subcommand's parser.
    """
    parser.add_argument("method", metavar="METHOD", help=f"one of {', '.join(METHODS)}")
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    parser.add_argument("--S", type=int, default=None,
                        help="Monte Carlo draws: samples, and velocities for riemannian-laplace "
                             "(default 1, also for ktied; laplace, riemannian-laplace, swag, "
                             "noisy-kfac: 2; kfac draws none)")
    parser.add_argument("--curvature", default=None,
                        help="ngvi: ef (default), hess or exact; slang: ef; laplace, "
                             "riemannian-laplace: ggn (default), hessian or ef; noisy-kfac, "
                             "kfac: ggn (default), ef or mc (labels drawn from the predictive, "
                             "the official estimator)")
    parser.add_argument("--precision", type=int, default=8,
                        help="digits after the point (default 8; 16 round-trips float64)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the inputs, draws and every intermediate as JSON (the "
                             "methods traced before the golden traces; see --save)")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="write the golden trace: FILE (.npz, no pickle: every input, draw "
                             "and intermediate by name) and FILE.json (its manifest), for "
                             "`refbayes verify`")
    parser.add_argument("--steps", type=int, default=None,
                        help="K chained steps (default 1; steps k + 1 >= 2 draw from "
                             "default_rng([seed, k])); swag: the SGD steps T >= 2 (default 6); "
                             "the Laplace and K-FAC traces are one fit (1)")
    parser.add_argument("--dtype", default=None, choices=golden.DTYPES,
                        help="precision of the traced run (default float64; float32 for the "
                             "step and driver methods)")
    step_group = parser.add_argument_group(
        f"step methods ({', '.join(STEP_METHODS)}); --M and --momentum also swag, --M also "
        f"{', '.join(KFAC_METHODS + KTIED_METHODS)}")
    step_group.add_argument("--M", type=int, default=None, help="minibatch rows (default 8)")
    step_group.add_argument("--L", type=int, default=None,
                            help="rank of U: SLANG's rank, and the low-rank part of the starting "
                                 "precision for ngvi (default 2)")
    step_group.add_argument("--momentum", type=float, default=None,
                            help="b of (ngvi.13) (default 0); swag: the SGD's heavy-ball "
                                 "momentum (swag.9) (default 0.9)")
    step_group.add_argument("--t", type=int, default=None,
                            help="steps already taken (default 0; momentum shows from t > 0)")
    la_group = parser.add_argument_group(
        f"Laplace methods ({', '.join(LAPLACE_METHODS)})",
        "The problem and the MAP recipe are printed, and described in the refbayes.trace "
        "module docstring.")
    la_group.add_argument("--prior-precision", dest="prior_precision", type=float, default=None,
                          help="delta > 0 on every parameter; the MAP is refound for it "
                               "(default 1)")
    la_group.add_argument("--structure", default=None,
                          help="precision structure: full (default), diag or kron")
    la_group.add_argument("--subset", default=None,
                          help="random parameters: all (default) or last_layer (laplace-torch's "
                               "default subset)")
    la_group.add_argument("--ode-method", dest="ode_method", default=None,
                          help="riemannian-laplace: solve_ivp method RK45 (default, the official "
                               "code's), RK23 or DOP853")
    la_group.add_argument("--rtol", type=float, default=None,
                          help="riemannian-laplace: solve_ivp rtol (default 1e-6, the official "
                               "code's)")
    la_group.add_argument("--atol", type=float, default=None,
                          help="riemannian-laplace: solve_ivp atol (default 1e-3, the official "
                               "code's)")
    swag_group = parser.add_argument_group(
        "SWAG (swag)",
        "T SGD steps from a drawn start, a snapshot collected after each, then the SWAG and "
        "SWAG-Diagonal Gaussians, their draws and log densities; also --M, --momentum and --S. "
        "Problem, draws and order are printed, and described in the refbayes.trace module "
        "docstring; --steps is T, the SGD steps, one snapshot after each, >= 2 (default 6).")
    swag_group.add_argument("--K", type=int, default=None,
                            help="deviation buffer size (official max_num_models), >= 2 "
                                 "(default 4: with 6 steps the ring buffer wraps)")
    swag_group.add_argument("--scale", type=float, default=None,
                            help="SWAG covariance multiplier (default 0.5, the paper's; "
                                 "SWAG-Diagonal is traced at 1)")
    swag_group.add_argument("--alpha", type=float, default=None,
                            help="SGD step size on the summed objective, torch lr = N alpha "
                                 "(default 2e-3: lr 0.1 with N = 50)")
    nk_group = parser.add_argument_group(
        f"Noisy K-FAC ({', '.join(KFAC_METHODS)})",
        "One noisy_kfac.step (kfac: eps = None) on an MLP [5, 4, 2] of the step methods' data, "
        "from drawn non-identity factors; also --M, --S (noisy-kfac) and --curvature. Problem, "
        "config, draws, their order and the sampling map are printed, and described in the "
        "refbayes.trace module docstring.")
    nk_group.add_argument("--damping", default=None,
                          help="factored (default, the official K-FAC damping) or exact "
                               "(A kron S + gamma I)")
    nk_group.add_argument("--kl-clip", dest="kl_clip", type=float, default=None,
                          help="KL-clipping bound kappa > 0 of (noisy_kfac.10) (official "
                               "kl_clip, 1e-3 in its configs; default: no clipping)")
    kt_group = parser.add_argument_group(
        f"k-tied Normal ({', '.join(KTIED_METHODS)})",
        "One ktied.step of an MLP [4, 5, 3] classifier on a 3-class problem drawn by a fixed "
        "recipe, from ktied.init with drawn mean and jitter; also --M and --S. Problem, layout, "
        "config, draws and their order are printed, and described in the refbayes.trace module "
        "docstring.")
    kt_group.add_argument("--k", type=int, default=None,
                          help="rank k of every layer's tie A_l = U_l V_l^T, >= 1 (default 2)")


def _resolve(args) -> dict:
    """The options that apply to args.method, defaults filled in; ValueError for one given to a
    method it does not apply to."""
    method = _check_method(args.method)
    out = {}
    for dest, defaults in OPTIONS.items():
        value = getattr(args, dest, None)
        if method in defaults:
            out[dest] = defaults[method] if value is None else value
        elif value is not None:
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag}: applies to {', '.join(defaults)} only, not {method}")
    return out


def _json_folder(path: Path, flag: str = "--json") -> None:
    """Make ``path``'s folder ready: create it when its own parent exists, never more.

    A mistyped ``--json /nonexistent/dir/x.json`` is an error naming the path, not a tree of
    folders created from the filesystem root.
    """
    parent = path.parent
    if parent.is_dir():
        return
    for folder in (parent, parent.parent):
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"{flag}: cannot write {path}: {folder} is not a folder")
    if not parent.parent.is_dir():
        raise ValueError(f"{flag}: cannot write {path}: the folder {parent.parent} does not exist "
                         "(only the file's own folder is created)")
    parent.mkdir()


def run(args) -> int:
    """Run the ``refbayes trace`` handler: print the trace, optionally write the JSON or golden trace.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of ``add_arguments``.

    Returns
    -------
    int
        The exit status, 0.

    Raises
    ------
    ValueError
        For an unknown method, an option outside its range or given to a method it does not
        apply to, --steps > 1 for a one-fit trace, float32 for a float64-only trace, or a
        --json / --save path whose folder cannot be made.
    """
    precision = check_int(args.precision, "precision", low=0, high=17)
    method = _check_method(args.method)
    if args.json is not None:
        if method in DRIVER_METHODS:
            raise ValueError(f"--json: {method} is traced by refbayes.golden only; use --save FILE")
        _json_folder(Path(args.json))
    if args.save is not None:
        if not str(args.save).endswith(".npz"):
            raise ValueError(f"--save: expected a file name ending in .npz, got {args.save!r}")
        _json_folder(Path(args.save), "--save")
    opts = _resolve(args)
    dtype = args.dtype or "float64"
    if not golden.TRACERS[method].chained and args.steps not in (None, 1):
        raise ValueError(f"--steps: {method} is traced as one fit; expected 1, got {args.steps}")
    # the methods with a printed form of their own keep it for one step (swag: one SGD run)
    printed = method in TABLE_METHODS and dtype == "float64" \
        and (method in SWAG_METHODS or args.steps in (None, 1))
    if args.json is not None and not printed:
        raise ValueError("--json: writes the one-step float64 trace only; use --save for "
                         "--steps and --dtype")
    trace = None
    if args.save is not None or not printed:
        trace = golden.build(method, seed=args.seed, steps=args.steps, dtype=dtype, **opts)
    if printed:
        inputs = _printed_inputs(method, args.seed, args.steps, opts)
        info = _info(inputs)
        print(format_trace(inputs, info, precision), end="")
        if args.json is not None:
            path = atomic_write_text(args.json, json.dumps(to_json(inputs, info), indent=1) + "\n")
            print(f"json: {path}")
    else:
        print(format_golden(trace, precision), end="")
    if args.save is not None:
        path = golden.save(trace, args.save)
        print(f"saved: {path} and {path.name}.json")
    return 0


def _printed_inputs(method: str, seed: int, steps, opts: dict):
    """The inputs of the printed one-step (one-fit, one-SGD-run) trace of the first methods."""
    if method in STEP_METHODS:
        return make_inputs(method, seed=seed, **opts)
    if method in LAPLACE_METHODS:
        return make_laplace_inputs(method, seed=seed, **opts)
    if method in KFAC_METHODS:
        return make_noisy_kfac_inputs(method, seed=seed, **opts)
    if method in KTIED_METHODS:
        return make_ktied_inputs(method, seed=seed, **opts)
    return make_swag_inputs(seed=seed, steps=6 if steps is None else steps, **opts)
