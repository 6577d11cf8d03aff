"""The official SWAG code (wjmaddox/swa_gaussian at 82c96926, ``swag/posteriors/swag.py``) as
linear maps of its standard-normal draws and against dense Gaussian densities: errata E1, E2
(their complete statements) and E3, finding F4 of derivations/swag.md.

Two kinds of test:

- always run: the official operations TRANSCRIBED (each line cites file:line at 82c96926),
  beside refbayes' own ``swag.sample`` / ``swag.log_density``, both checked against the dense
  formula the erratum states;
- with ``SWA_GAUSSIAN_PATH`` set to a checkout of the official repository (torch and gpytorch
  installed): the official functions themselves, their draws injected, against the same dense
  formulas and refbayes. Skipped when it is unset: the official code is neither downloaded nor
  copied into refbayes. gpytorch >= 1.11 dropped ``gpytorch.lazy``'s ``*LazyTensor`` names; the
  loader adds them as the ``linear_operator`` classes they were aliases of (gpytorch 1.9-1.10).
"""
from __future__ import annotations

import importlib.util
import itertools
import math
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from scipy.linalg import block_diag
from scipy.stats import multivariate_normal, norm

from refbayes.methods import swag
from tests.tolerances import EXACT_F64, rel_err

# Linear(3, 2) then Linear(2, 1): the official code's blocks are the parameter tensors
# (weight 2x3, bias 2, weight 1x2, bias 1), each with its own buffers
SIZES = (6, 2, 2, 1)
D = sum(SIZES)
EDGES = np.cumsum((0,) + SIZES)


def _snapshots(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, D)) * 0.3 + rng.standard_normal(D)


def _collected(thetas, K):
    cfg = swag.SWAGConfig(K=K)
    state = swag.init(thetas[0], cfg)
    for th in thetas:
        state, _ = swag.collect(state, th, cfg)
    return state, cfg


def _blocks(x):
    return [x[a:b] for a, b in itertools.pairwise(EDGES)]


def _blockwise_transcribed(mean, sq_mean, C, K, scale, z, var_clamp=1e-30):
    """swag.py:68-94 (sample_blockwise, cov=True, fullrank=True), written out: per tensor b,
    eps_b = randn_like(mean_b) (:73), var_b = clamp(sq_mean_b - mean_b^2, var_clamp) (:75),
    mean_b + scale sqrt(var_b) eps_b (:77) + scale / sqrt(K - 1) C_b^T z2_b (:81-84), z2_b a
    fresh (K', 1) normal per tensor (:81). z holds the draws in the official order (per tensor:
    its D_b, then its K')."""
    out, pos, Kp = [], 0, C.shape[0]
    for m, s, Cb in zip(_blocks(mean), _blocks(sq_mean), np.split(C, EDGES[1:-1], axis=1)):
        eps, z2 = z[pos:pos + m.size], z[pos + m.size:pos + m.size + Kp]
        pos += m.size + Kp
        var = np.maximum(s - m ** 2, var_clamp)
        out.append(m[:, None] + scale * np.sqrt(var)[:, None] * eps
                   + scale / math.sqrt(K - 1) * Cb.T @ z2)
    assert pos == z.shape[0]
    return np.vstack(out)


def _blockdiag_lowrank(C):
    return block_diag(*[Cb.T @ Cb for Cb in np.split(C, EDGES[1:-1], axis=1)])


# ----------------------------------------------------------------------------- always run

@pytest.mark.parametrize("scale", [0.5, 1.0])
def test_erratum_blockwise_low_rank_part_is_block_diagonal(scale):
    """E1, complete: sample_blockwise draws its own z2 for every parameter tensor, so its
    covariance is scale^2 (Sigma_diag + blockdiag_b(D_b D_b^T) / (K - 1)): zero low-rank
    covariance across tensors, not scale^2 (Sigma_diag + Sigma_lr). It is refbayes' sample run
    on each tensor's own moments with scale^2 and independent z2 (n >= K, so K' = K)."""
    K, n = 4, 7
    thetas = _snapshots(n, 0)
    state, cfg = _collected(thetas, K)
    Dh = swag.deviations(state)                                   # C^T, the official order
    Kp = Dh.shape[1]
    B = len(SIZES)
    Z = np.eye(D + B * Kp)                                        # identity draws: the linear map
    mean = state.theta_bar
    A = _blockwise_transcribed(mean, state.theta2_bar, Dh.T, K, scale, Z) - mean[:, None]
    # refbayes on each tensor's slice of the snapshots, scale^2, the same draws
    ours, pos = [], 0
    for a, b in itertools.pairwise(EDGES):
        st_b, cfg_b = _collected(thetas[:, a:b], K)
        z1, z2 = Z[pos:pos + b - a], Z[pos + b - a:pos + b - a + Kp]
        pos += b - a + Kp
        ours.append(swag.sample(st_b, z1, z2, cfg_b._replace(scale=scale ** 2)))
    ours = np.vstack(ours) - mean[:, None]
    assert rel_err(ours, A) < EXACT_F64
    var = swag.diag_variance(state, cfg)
    corrected = scale ** 2 * (np.diag(var) + _blockdiag_lowrank(Dh.T) / (K - 1))
    assert rel_err(A @ A.T, corrected) < EXACT_F64
    assert rel_err(ours @ ours.T, corrected) < EXACT_F64
    # the previous statement of E1 (the full low-rank term) is off by the cross-tensor blocks,
    # which refbayes' own sample (= sample_fullrank) does have
    e1_old = scale ** 2 * swag.dense_covariance(state, cfg._replace(scale=1.0))
    assert rel_err(A @ A.T, e1_old) > 0.1
    z1 = np.hstack([np.eye(D), np.zeros((D, Kp))])
    z2 = np.hstack([np.zeros((Kp, D)), np.eye(Kp)])
    full = swag.sample(state, z1, z2, cfg._replace(scale=scale ** 2)) - mean[:, None]
    assert rel_err(full @ full.T, e1_old) < EXACT_F64
    off = np.ones((D, D), bool)
    for a, b in itertools.pairwise(EDGES):
        off[a:b, a:b] = False
    assert np.all((A @ A.T)[off] == 0) and np.max(np.abs((full @ full.T)[off])) > 1e-3


def test_erratum_blockwise_divisor_is_k_minus_1_before_the_buffer_fills():
    """E1 / F2: while n < K the blockwise low-rank term is also divided by K - 1, not K' - 1;
    refbayes' per-tensor sample with z2 scaled by sqrt((K' - 1)/(K - 1)) reproduces it."""
    K, n, scale = 6, 3, 0.5
    thetas = _snapshots(n, 1)
    state, cfg = _collected(thetas, K)
    Dh = swag.deviations(state)
    Kp = Dh.shape[1]
    Z = np.eye(D + len(SIZES) * Kp)
    A = _blockwise_transcribed(state.theta_bar, state.theta2_bar, Dh.T, K, scale, Z)
    ours, pos = [], 0
    for a, b in itertools.pairwise(EDGES):
        st_b, cfg_b = _collected(thetas[:, a:b], K)
        z1, z2 = Z[pos:pos + b - a], Z[pos + b - a:pos + b - a + Kp]
        pos += b - a + Kp
        ours.append(swag.sample(st_b, z1, z2 * math.sqrt((Kp - 1) / (K - 1)),
                                cfg_b._replace(scale=scale ** 2)))
    assert rel_err(np.vstack(ours), A) < EXACT_F64
    A = A - state.theta_bar[:, None]
    var = swag.diag_variance(state, cfg)
    assert rel_err(A @ A.T, scale ** 2 * (np.diag(var) + _blockdiag_lowrank(Dh.T) / (K - 1))) \
        < EXACT_F64


def _official_fullrank_transcribed(thetas, K, scale, z1, z2, var_clamp=1e-30):
    """swag.py:148-178 (collect_model) then swag.py:96-139 (sample_fullrank, cov=True), on the
    flat vector (flatten of the per-tensor buffers, :117-118, :125), written out:
    mean = mean n/(n+1) + theta/(n+1) (:154-156), sq_mean likewise with theta^2 (:159-161),
    append theta - mean (new mean) as a row (:168-169), drop row 0 when n + 1 > K (:172-173);
    var = clamp(sq_mean - mean^2, var_clamp) (:120), var_sample = sqrt(var) z1 (:121),
    cov_sample = C^T z2 / sqrt(max_num_models - 1) (:127-132), mean + sqrt(scale)
    (var_sample + cov_sample) (:97, :134, :139). Returns the draws, C (K', D), mean and var."""
    mean, sq_mean, rows = np.zeros(D), np.zeros(D), []
    for n, th in enumerate(thetas):
        mean = mean * n / (n + 1.0) + th / (n + 1.0)
        sq_mean = sq_mean * n / (n + 1.0) + th ** 2 / (n + 1.0)
        rows.append(th - mean)
        if n + 1 > K:
            rows.pop(0)
    C = np.array(rows)
    var = np.maximum(sq_mean - mean ** 2, var_clamp)
    cov_sample = C.T @ z2 / (K - 1) ** 0.5
    return mean[:, None] + scale ** 0.5 * (np.sqrt(var)[:, None] * z1 + cov_sample), C, mean, var


@pytest.mark.parametrize("K, n", [(6, 3), (6, 5), (6, 6), (4, 9)])
def test_official_divisor_conversion_for_n_below_and_above_K(K, n):
    """F2 and the conventions table: the official sample_fullrank divides the low-rank draw by
    sqrt(max_num_models - 1) also while n < K; refbayes by sqrt(K' - 1), K' = min(n, K). With
    cfg = conventions.from_swa_gaussian(max_num_models=K, scale=...) and z2 scaled by
    sqrt((K' - 1)/(K - 1)) refbayes' draws are the official draws, draw by draw, and the
    converted covariance scale (Sigma_diag + (K' - 1)/(K - 1) Sigma_lr) is the official
    scale (Sigma_diag + C^T C / (K - 1)). For n >= K the factor is 1 (no conversion)."""
    # checks (swag.5), (swag.6), (swag.7)
    from refbayes.conventions import swa_gaussian as cv
    thetas = _snapshots(n, 10 * K + n)
    Kp = min(n, K)
    rng = np.random.default_rng(n)
    Z1 = np.hstack([np.eye(D), np.zeros((D, Kp)), rng.standard_normal((D, 3))])
    Z2 = np.hstack([np.zeros((Kp, D)), np.eye(Kp), rng.standard_normal((Kp, 3))])
    for scale in (0.5, 1.0):
        cfg = cv.from_swa_gaussian(max_num_models=K, scale=scale)
        state = swag.init(thetas[0], cfg)
        for th in thetas:
            state, _ = swag.collect(state, th, cfg)
        official, C, mean, var_off = _official_fullrank_transcribed(thetas, K, scale, Z1, Z2)
        assert C.shape == (Kp, D) and rel_err(C.T, swag.deviations(state)) < EXACT_F64
        factor = (Kp - 1) / (K - 1)                       # the conversion, 1 once n >= K
        assert cv.swa_gaussian_z2_factor(n, K) == math.sqrt(factor)
        ours = swag.sample(state, Z1, Z2 * cv.swa_gaussian_z2_factor(n, K), cfg)
        assert rel_err(ours, official) < EXACT_F64
        A = official[:, :D + Kp] - mean[:, None]                      # the linear map, (D, D + K')
        official_cov = scale * (np.diag(var_off) + C.T @ C / (K - 1))
        assert rel_err(A @ A.T, official_cov) < EXACT_F64
        var = swag.diag_variance(state, cfg)
        lr = swag.dense_covariance(state, cfg) - scale * np.diag(var)  # scale Sigma_lr, (swag.5)
        converted = scale * np.diag(var) + factor * lr
        assert rel_err(converted, official_cov) < EXACT_F64
        unconverted = swag.sample(state, Z1, Z2, cfg)
        if n < K:  # without the conversion the draws and the covariance differ
            assert rel_err(unconverted, official) > 1e-3
            assert rel_err(swag.dense_covariance(state, cfg), official_cov) > 1e-3
        else:
            assert factor == 1.0 and rel_err(unconverted, official) < EXACT_F64


def _official_logprob_transcribed(x, mean, sq_mean, C, *, block):
    """swag.py:223-279 (generate_mean_var_covar, compute_ll_for_block, block_logll /
    full_logll), exact (gpytorch's Cholesky path, D <= 800): var = sq_mean - mean^2 unclamped
    (:233); N(mean, diag(var + 1e-6) (:243) + C^T C (:242)); block=True sums that density over
    the tensors (:261-269)."""
    var = sq_mean - mean ** 2
    low = _blockdiag_lowrank(C) if block else C.T @ C
    return multivariate_normal(mean, np.diag(var + 1e-6) + low).logpdf(x.T)


def _official_diag_logll_transcribed(x, mean, sq_mean):
    """swag.py:296-300 (diag_logll): sum over tensors of Normal(mean, scale=var).log_prob with
    var = sq_mean - mean^2 (:233); torch's Normal(loc, scale) is scipy's norm(loc, scale)."""
    var = sq_mean - mean ** 2
    return norm(mean[:, None], var[:, None]).logpdf(x).sum(axis=0)


def test_erratum_official_diag_log_density_uses_the_variance_as_standard_deviation():
    """E3: compute_logprob(diag=True) passes the variance as torch Normal's scale (a standard
    deviation): the density of N(mean, diag(var)^2). The SWAG-Diagonal Gaussian is
    N(theta_bar, diag(var)) (paper scale 1), the density refbayes' log_density(low_rank=False)
    returns and its sampler draws from; they differ by several nats here."""
    thetas = _snapshots(7, 0)
    state, cfg = _collected(thetas, 4)
    cfg = cfg._replace(scale=1.0)
    pts = state.theta_bar[:, None] + np.random.default_rng(1).standard_normal((D, 4)) * 0.2
    ours = swag.log_density(state, pts, cfg, low_rank=False)
    A = swag.sample(state, np.eye(D), None, cfg) - state.theta_bar[:, None]
    assert rel_err(ours, multivariate_normal(state.theta_bar, A @ A.T).logpdf(pts.T)) < EXACT_F64
    var = swag.diag_variance(state, cfg)
    assert rel_err(ours, multivariate_normal(state.theta_bar, np.diag(var)).logpdf(pts.T)) \
        < EXACT_F64
    printed = _official_diag_logll_transcribed(pts, state.theta_bar, state.theta2_bar)
    assert rel_err(printed,
                   multivariate_normal(state.theta_bar, np.diag(var ** 2)).logpdf(pts.T)) \
        < EXACT_F64
    assert np.min(np.abs(printed - ours)) > 1.0


def test_erratum_official_block_log_density_is_block_diagonal():
    """E2, complete: compute_logprob(block=True) is the density of N(mean, diag(var + 1e-6) +
    blockdiag_b(C_b^T C_b)), the per-tensor form of E2's printed line (still no 1/(K - 1), no
    scale); neither it nor block=False is the density of either sampler. refbayes'
    log_density is its sampler's density (the blockwise sampler's density is refbayes'
    log_density summed over the per-tensor states at scale^2, n >= K)."""
    K, scale = 4, 0.5
    thetas = _snapshots(7, 2)
    state, cfg = _collected(thetas, K)
    cfg = cfg._replace(scale=scale)
    Dh = swag.deviations(state)
    pts = state.theta_bar[:, None] + np.random.default_rng(3).standard_normal((D, 4)) * 0.2
    var = swag.diag_variance(state, cfg)
    blockwise_cov = scale ** 2 * (np.diag(var) + _blockdiag_lowrank(Dh.T) / (K - 1))
    per_tensor = sum(
        swag.log_density(_collected(thetas[:, a:b], K)[0], pts[a:b],
                         cfg._replace(scale=scale ** 2))
        for a, b in itertools.pairwise(EDGES))
    assert rel_err(per_tensor, multivariate_normal(state.theta_bar, blockwise_cov).logpdf(pts.T)) \
        < EXACT_F64
    ours = swag.log_density(state, pts, cfg)
    assert rel_err(ours, multivariate_normal(state.theta_bar, swag.dense_covariance(state, cfg))
                   .logpdf(pts.T)) < EXACT_F64
    for block in (False, True):
        printed = _official_logprob_transcribed(pts, state.theta_bar, state.theta2_bar, Dh.T,
                                                block=block)
        assert np.max(np.abs(printed - ours)) > 1.0
        assert np.max(np.abs(printed - per_tensor)) > 1.0


# ----------------------------------------------------------------------------- the official code

ENV = "SWA_GAUSSIAN_PATH"


@pytest.fixture(scope="module")
def official():
    """The official swag/posteriors/swag.py and swag/utils.py loaded from $SWA_GAUSSIAN_PATH
    under a private package name (swag/__init__.py, which needs torchvision, is not run)."""
    root = os.environ.get(ENV)
    if not root:
        pytest.skip(f"{ENV} is unset: point it at a checkout of wjmaddox/swa_gaussian (82c96926)")
    torch = pytest.importorskip("torch")
    pytest.importorskip("tqdm")  # swag/utils.py imports it
    gl = pytest.importorskip("gpytorch.lazy")
    ops = pytest.importorskip("linear_operator.operators")
    src = Path(root) / "swag"
    if not (src / "posteriors" / "swag.py").is_file():
        pytest.fail(f"{ENV}={root}: expected the repository root (swag/posteriors/swag.py)")
    with pytest.MonkeyPatch.context() as mp:
        for kind in ("Root", "Diag", "AddedDiag"):
            if not hasattr(gl, kind + "LazyTensor"):
                mp.setattr(gl, kind + "LazyTensor", getattr(ops, kind + "LinearOperator"),
                           raising=False)
        pkg = "_swa_gaussian_official"
        mods = {}
        for name, path in ((pkg, None), (pkg + ".utils", src / "utils.py"),
                           (pkg + ".posteriors", None),
                           (pkg + ".posteriors.swag", src / "posteriors" / "swag.py")):
            if path is None:
                mod = types.ModuleType(name)
                mod.__path__ = []
            else:
                spec = importlib.util.spec_from_file_location(name, path)
                mod = importlib.util.module_from_spec(spec)
            mp.setitem(sys.modules, name, mod)
            if path is not None:
                spec.loader.exec_module(mod)
            mods[name] = mod
        yield types.SimpleNamespace(torch=torch, SWAG=mods[pkg + ".posteriors.swag"].SWAG,
                                    flatten=mods[pkg + ".utils"].flatten)


def _net(torch):
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).double()


def _official_swag(off, thetas, K):
    torch = off.torch
    torch.manual_seed(0)
    sw = off.SWAG(lambda: _net(torch), no_cov_mat=False, max_num_models=K)
    model = _net(torch)
    for th in thetas:
        torch.nn.utils.vector_to_parameters(torch.tensor(th), model.parameters())
        sw.collect_model(model)
    get = [lambda mo, nm, s=s: getattr(mo, f"{nm}_{s}") for s in ("mean", "sq_mean")]
    mean, sq = (off.flatten([g(mo, nm) for mo, nm in sw.params]).numpy() for g in get)
    C = torch.cat([getattr(mo, f"{nm}_cov_mat_sqrt") for mo, nm in sw.params], 1).numpy()
    return sw, mean, sq, C


def _linear_map(off, sw, ndraw, monkeypatch, **kw):
    """Run sw.sample(**kw) with its draws (torch.randn_like, Tensor.normal_, in call order)
    taken from the columns of [0, I]: the offset and the linear map of the draws."""
    torch = off.torch
    queue = []

    def take(t):
        k = t.numel()
        out = torch.tensor(queue[:k], dtype=t.dtype).view_as(t)
        del queue[:k]
        return out

    monkeypatch.setattr(torch, "randn_like", lambda t, *a, **k: take(t))
    monkeypatch.setattr(torch.Tensor, "normal_", lambda self, *a, **k: self.copy_(take(self)))
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)  # swag.py:146
    cols = []
    for z in np.hstack([np.zeros((ndraw, 1)), np.eye(ndraw)]).T:
        queue[:] = list(z)
        sw.sample(**kw)
        assert not queue, "the sampler drew fewer numbers than expected"
        cols.append(off.flatten([getattr(mo, nm).reshape(-1) for mo, nm in sw.params]).numpy())
    cols = np.array(cols).T
    return cols[:, 0], cols[:, 1:] - cols[:, :1]


@pytest.mark.parametrize("K, n", [(4, 7), (5, 3)])
def test_official_samplers_as_linear_maps(official, monkeypatch, K, n):
    """The official collect_model equals refbayes' collect; sample_fullrank(scale) equals
    refbayes' sample with the same draws (n >= K) and has covariance
    scale (Sigma_diag + C^T C / (K - 1)) (divisor K - 1 also for n < K, F2), ignoring its
    fullrank argument; sample_blockwise draws D + B K' numbers and has E1's corrected covariance
    (the transcription above, exactly)."""
    thetas = _snapshots(n, K)
    sw, mean, sq, C = _official_swag(official, thetas, K)
    state, cfg = _collected(thetas, K)
    assert rel_err(mean, state.theta_bar) < EXACT_F64 and rel_err(sq, state.theta2_bar) < EXACT_F64
    assert rel_err(C.T, swag.deviations(state)) < EXACT_F64
    Kp, B = C.shape[0], len(SIZES)
    var = swag.diag_variance(state, cfg)
    for scale in (0.5, 1.0):
        full = scale * (np.diag(var) + C.T @ C / (K - 1))
        for fullrank in (True, False):
            b, A = _linear_map(official, sw, D + Kp, monkeypatch, scale=scale, cov=True,
                               fullrank=fullrank)
            assert rel_err(b, mean) < EXACT_F64 and rel_err(A @ A.T, full) < EXACT_F64
        if n >= K:
            ours = swag.sample(state, np.eye(D, D + Kp), np.eye(Kp, D + Kp, D),
                               cfg._replace(scale=scale))
            assert rel_err(ours - mean[:, None], A) < EXACT_F64
        b, A = _linear_map(official, sw, D + B * Kp, monkeypatch, scale=scale, cov=True,
                           block=True)
        Z = np.eye(D + B * Kp)
        assert rel_err(A, _blockwise_transcribed(mean, sq, C, K, scale, Z) - mean[:, None]) \
            < EXACT_F64
        corrected = scale ** 2 * (np.diag(var) + _blockdiag_lowrank(C) / (K - 1))
        assert rel_err(A @ A.T, corrected) < EXACT_F64
        assert rel_err(A @ A.T, scale * full) > 0.1  # E1's previous statement


def test_official_log_densities_against_dense(official):
    """compute_logprob on the exact (Cholesky, D <= 800) path: block=False and block=True are
    the dense densities of E2, diag=True that of E3 (variance as standard deviation);
    compute_logdet is log det(diag(var + 1e-6) + C^T C). None is refbayes' log_density."""
    torch = official.torch
    K, scale = 4, 0.5
    thetas = _snapshots(7, 2)
    sw, mean, sq, C = _official_swag(official, thetas, K)
    state, cfg = _collected(thetas, K)
    pts = mean[:, None] + np.random.default_rng(3).standard_normal((D, 3)) * 0.2

    def logprob(**kw):
        return np.array([float(sw.compute_logprob(torch.tensor(p)[None], **kw)) for p in pts.T])

    for block in (False, True):
        printed = _official_logprob_transcribed(pts, mean, sq, C, block=block)
        assert rel_err(logprob(block=block), printed) < EXACT_F64
    diag = logprob(diag=True)
    assert rel_err(diag, _official_diag_logll_transcribed(pts, mean, sq)) < EXACT_F64
    var = sq - mean ** 2
    assert rel_err(diag, multivariate_normal(mean, np.diag(var ** 2)).logpdf(pts.T)) < EXACT_F64
    logdet = np.linalg.slogdet(np.diag(var + 1e-6) + C.T @ C)[1]
    assert abs(float(sw.compute_logdet()) - logdet) < EXACT_F64 * abs(logdet)
    for kw in ({}, {"block": True}):
        ours = swag.log_density(state, pts, cfg._replace(scale=scale))
        assert np.max(np.abs(logprob(**kw) - ours)) > 1.0
    assert np.min(np.abs(diag - swag.log_density(state, pts, cfg._replace(scale=1.0),
                                                 low_rank=False))) > 1.0


def test_official_log_density_settings_and_iterative_estimate(official, monkeypatch):
    """F4: `with num_trace_samples(1) and max_cg_iterations(25):` (swag.py:247-249) enters only
    max_cg_iterations(25) (`a and b` is b); above gpytorch's max_cholesky_size (800 by default,
    i.e. every network) log_prob is a stochastic estimate (CG, and SLQ with the default number
    of probes) that draws from torch's global generator. Forced here at D = 11."""
    torch = official.torch
    import linear_operator
    from linear_operator.operators._linear_operator import LinearOperator
    sw, mean, _, _ = _official_swag(official, _snapshots(7, 2), 4)
    x = torch.tensor(mean + 0.2)[None]
    seen = {}
    orig = LinearOperator.inv_quad_logdet

    def spy(self, *a, **k):
        seen["probes"] = linear_operator.settings.num_trace_samples.value()
        seen["cg"] = linear_operator.settings.max_cg_iterations.value()
        return orig(self, *a, **k)

    monkeypatch.setattr(LinearOperator, "inv_quad_logdet", spy)
    exact = float(sw.compute_logprob(x))
    assert seen["cg"] == 25 and seen["probes"] != 1
    assert seen["probes"] == linear_operator.settings.num_trace_samples.value()
    with linear_operator.settings.max_cholesky_size(0):
        est = []
        for seed in range(3):
            torch.manual_seed(seed)
            est.append(float(sw.compute_logprob(x)))
            after = torch.rand(1)
            torch.manual_seed(seed)
            assert torch.rand(1) != after  # it drew from the global generator
    est = np.array(est)
    assert np.ptp(est) > 1e-3 and np.min(np.abs(est - exact)) > 1e-6


def test_swa_gaussian_z2_factor_refuses_what_has_no_low_rank_term():
    from refbayes.conventions import swa_gaussian as cv
    assert cv.swa_gaussian_z2_factor(9, 4) == 1.0
    for n, K, name in ((1, 4, "n"), (3, 1, "max_num_models"), (2.5, 4, "n")):
        with pytest.raises(ValueError, match=rf"^{name}: "):
            cv.swa_gaussian_z2_factor(n, K)
