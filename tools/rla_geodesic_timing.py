"""Time one Riemannian Laplace geodesic five ways, in one process: refbayes' closed-form
Hessian-vector product (the R-operator, ``FlatModel.hvp``), autograd's HVP (``_hvp_autograd``),
refbayes' dense autograd Hessian, and the official code's approach (PyTorch: torch.func gradient
and forward-over-reverse HVP, scipy's solve_ivp on float64 state) with the right-hand side in
float32, as the official code evaluates it, and in float64 (equal precision), on the regression net of the RLA paper and of
asv_benchmarks/benchmarks/bench_laplace.py (MLP [1, 15, 1] tanh, D = 46, N = 100 rows of
y = sin(2 x) + N(0, 0.2^2), prior precision 1, theta0 and v as in its ExpMap benchmark).

Needs PyTorch (refbayes does not depend on it):

    python -m venv /tmp/lt && /tmp/lt/bin/pip install -e . torch
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /tmp/lt/bin/python tools/rla_geodesic_timing.py

The official-style right-hand side is written here from the official code's description
(riemannian_laplace.md, Conventions): the same geodesic equation (riemannian_laplace.7) with
grad L and H[L] u from torch.func, evaluated in float32; it is not the official code itself.
Prints, per solver setting, the median seconds per geodesic over REPEATS runs, the number of
right-hand-side evaluations, the time per evaluation, and the end point's relative distance to
refbayes' HVP-path end point.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.integrate import solve_ivp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "asv_benchmarks"))
from benchmarks import bench_laplace as bench  # noqa: E402

from refbayes.methods import riemannian_laplace as rl  # noqa: E402

__all__ = ["main", "official_style_exp_map"]

REPEATS = 5
N = 100


def _torch_loss(model, X, y, delta, dtype):
    """L(theta) = tau/2 sum (y - f)^2 + delta/2 |theta|^2 on a flat torch theta (the summed
    Gaussian NLL without its constant, which no derivative sees), refbayes' theta layout."""
    Xt, yt = torch.tensor(X, dtype=dtype), torch.tensor(y, dtype=dtype)
    tau = model.likelihood.noise_precision
    shapes = [(n_in, n_out) for n_in, n_out in zip(model.sizes[:-1], model.sizes[1:])]

    def loss(theta):
        a, off = Xt, 0
        for l, (n_in, n_out) in enumerate(shapes):
            W = theta[off:off + n_in * n_out].reshape(n_in, n_out)
            b = theta[off + n_in * n_out:off + (n_in + 1) * n_out]
            off += (n_in + 1) * n_out
            a = a @ W + b
            if l < len(shapes) - 1:
                a = torch.tanh(a)
        return 0.5 * tau * torch.sum((yt - a[:, 0]) ** 2) + 0.5 * delta * torch.sum(theta ** 2)
    return loss


def official_style_exp_map(theta, v, loss, cfg, dtype=torch.float32):
    """solve_ivp of (riemannian_laplace.8) with g and H u from torch.func in ``dtype``."""
    D = theta.shape[0]
    grad = torch.func.grad(loss)

    def rhs(t, y):
        c = torch.tensor(y[:D], dtype=dtype)
        u = torch.tensor(y[D:], dtype=dtype)
        g, Hu = torch.func.jvp(grad, (c,), (u,))  # grad L(c) and H[L](c) u, forward-over-reverse
        acc = -(g / (1.0 + g @ g)) * (u @ Hu)
        return np.concatenate([y[D:], acc.double().numpy()])

    sol = solve_ivp(rhs, (0.0, 1.0), np.concatenate([theta, v]), method=cfg.method,
                    rtol=cfg.rtol, atol=cfg.atol)
    assert sol.status == 0, sol.message
    return sol.y[:D, -1], sol.nfev


def _median_seconds(fn):
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def main() -> int:
    torch.set_num_threads(1)
    model, theta, v = bench.model(), bench.theta0(), bench._velocity(N)
    X, y = bench.data(N)
    loss32 = _torch_loss(model, X, y, bench.PRIOR, torch.float32)
    loss64 = _torch_loss(model, X, y, bench.PRIOR, torch.float64)
    print(f"MLP [1, 15, 1] tanh, D = {model.D}, N = {N}; median of {REPEATS} runs, "
          f"torch {torch.__version__} threads {torch.get_num_threads()}")
    print(f"{'solver':<26} {'path':<32} {'s/geodesic':>10} {'nfev':>6} {'ms/eval':>8} "
          f"{'end vs hvp':>10}")
    for tol, cfg in bench.TOLS.items():
        ref_c = None
        for path in ("hvp", "autograd", "dense", "official-style", "official-style-f64"):
            if path.startswith("official-style"):
                loss, dtype = ((loss64, torch.float64) if path.endswith("f64")
                               else (loss32, torch.float32))
                sec, (c, nfev) = _median_seconds(
                    lambda: official_style_exp_map(theta, v, loss, cfg, dtype))  # noqa: B023
            else:
                run = bench.geodesic_case(path, tol, N)
                sec, info = _median_seconds(run)
                c, nfev = info.c, info.nfev
            if ref_c is None:
                ref_c = c
            err = float(np.max(np.abs(c - ref_c)) / np.max(np.abs(ref_c)))
            label = {"hvp": "refbayes closed-form HVP", "autograd": "refbayes autograd HVP",
                     "dense": "refbayes dense Hessian",
                     "official-style": "torch.func HVP, float32 RHS",
                     "official-style-f64": "torch.func HVP, float64 RHS"}[path]
            print(f"{tol + ' ' + cfg.method:<26} {label:<32} {sec:10.3f} {nfev:6d} "
                  f"{1e3 * sec / nfev:8.3f} {err:10.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
