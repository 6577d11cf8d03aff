"""Issue 36 part 1: seconds per CIFAR-10 epoch of LeNet-5 for each method of Osawa et al. (2019)
Table 1 (and K-FAC, Noisy K-FAC, SWAG's SGD), measured by timing refbayes' own step functions on
real CIFAR-10 minibatches, one BLAS thread, float64 and float32.

Run (a few minutes; the data from REFBAYES_DATA)::

    REFBAYES_DATA=/work/shared/data .venv/bin/python tools/cifar10_epoch_timing.py [--steps 20]

The thread variables are pinned to 1 here before NumPy is imported (threadpoolctl too, if
installed). Settings: derivations/cifar10_lenet.md, "Settings" (the official configs of
team-approx-bayes/dl-with-bayes); only what changes the cost matters here: the minibatch M,
the number of Monte Carlo draws S per step, the curvature and how often K-FAC's factors are
inverted. The step values (learning rates, prior precisions) are the official ones converted
to refbayes' units, but a timing does not depend on them.

The cases are the rows of ``refbayes reproduce cifar10-lenet``
(``refbayes.experiments.cifar10_lenet.make_method``), imported from there, plus SWAG's SGD.

Data: ``load_cifar10`` (float32), the official normalization (x - mean_c) / std_c with their
constants, rows form (M, 3072). Each case gets its own minibatches from one permutation
(``numpy.random.default_rng(SEED)``); every draw (eps, dropout masks) comes from seeded
generators too. Cases run interleaved, round by round: round r takes one step of every
(method, dtype) on minibatch r, so the machine's drifts fall on all alike; the first WARMUP
rounds are not timed; the order of the cases rotates by one each round, so no case always runs
first. A step is a real training step (the state moves on).

``--laplace-rows R`` (default 2000; 0: skip) also times the post-hoc Laplace rows (float64,
as the runner fits them): ``laplace_state`` on R training rows at theta0 (extrapolated to
50,000 rows: the curvature is a sum over row chunks), the evidence tuning
(the runner's ``evidence_tuned``: the optimizer on one row, then one chunked loss over the R
rows) and one GLM
predictive draw (``linearized_bma``) over 500 test rows, scaled to 10,000.
``--cases`` restricts the timed cases (by runner row name, or "sgd").

Printed per case: median and mean seconds per step, steps per epoch (ceil(50000 / M)),
seconds per epoch (median x steps), and the seconds of a forward pass over 128 test rows (median
of FWD_REPS), scaled to the 10,000 test images: one evaluation pass per posterior draw (the
official VOGN / MC-dropout prediction uses 10 draws).
"""
import os

# before NumPy loads its BLAS; importing the module (tests) changes nothing
if __name__ == "__main__":
    for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_v] = "1"

import argparse
import math
import time

import numpy as np

from refbayes.datasets import load_cifar10
from refbayes.experiments.calibration_methods import laplace_state, linearized_bma
from refbayes.experiments.cifar10_lenet import (  # the runner's rows: one construction
    MEAN,
    N_TRAIN,
    POSTHOC,
    STD,
    WEIGHT_DECAY,
    evidence_tuned,
    make_method,
    normalize,
    official_vogn_config,
)
from refbayes.methods import Batch, laplace, swag
from refbayes.models.conv import lenet5

__all__ = ["MEAN", "STD", "make_cases", "normalize", "official_vogn_config"]

N = N_TRAIN
SEED = 0
WARMUP = 2
FWD_REPS = 7

# the runner's rows (refbayes.experiments.cifar10_lenet.make_method: the settings of
# derivations/cifar10_lenet.md) under this table's names
CASES = {"adam": "Adam", "vogn": "VOGN (S=6, ef)", "bbb": "BBB (S=1)",
         "mc-dropout": "MC dropout (p=0.1)", "kfac": "K-FAC (T_inv=1)",
         "noisy-kfac": "Noisy K-FAC (S=4, T_inv=1)", "ktied": "k-tied (k=2, S=1)",
         "swag": "SWAG job (SGD, 0.05)"}
FIRST = ("adam", "vogn", "bbb", "mc-dropout", "kfac", "noisy-kfac", "sgd")  # make_cases' default


def make_cases(net, dtype, rng, only=None):
    """{name: (M, step(batch) -> None)} for one dtype; each closure keeps its own state.

    Each case is the runner's row (``make_method``): its step draws its noise from ``rng``, the
    step counter goes on per case (VOGN's first step is its OGN step and its KL weight warms up:
    the same cost per step). SWAG's SGD is not a runner row and is built here. ``only``: the
    row names (and "sgd") to build, default :data:`FIRST` (the first table's cases; main()
    times every case of :data:`CASES` unless --cases says otherwise).
    """
    only = FIRST if only is None else only
    dt = np.dtype(dtype)
    theta0 = net.init_theta(np.random.default_rng(SEED), dtype=dt)
    cases = {}
    for name, label in CASES.items():
        if name not in only:
            continue
        method = make_method(name, net, theta0, N, init_rng=np.random.default_rng(SEED + 9))
        st = {"state": method.state, "t": 0}

        def case_step(batch, method=method, st=st):
            st["state"], _ = method.step(st["state"], batch, rng, st["t"], 0)
            st["t"] += 1
        cases[label] = (method.M, case_step)

    # SWAG's SGD: distributed/.../lenet_sgd_bs128_4gpu.json: lr 1e-3, momentum 0.9, wd 1e-2
    cfg_s = swag.SGDConfig(N=N, lam=N * 1e-2, alpha=1e-3 / N, momentum=0.9)
    sgd = {"state": swag.sgd_init(theta0.copy())}

    def sgd_step(batch):
        sgd["state"], _ = swag.sgd_step(sgd["state"], batch, None, cfg_s, net)
    if "sgd" in only:
        cases["SGD (SWAG's base)"] = (128, sgd_step)
    return cases, theta0


def time_laplace(net, X, y, X_test, R):
    """Print the float64 seconds of each post-hoc Laplace row: the fit on R rows and its
    50,000-row extrapolation, the evidence tuning, one GLM predictive draw on 10,000 rows."""
    theta = net.init_theta(np.random.default_rng(SEED), dtype=np.float64)
    X, X_test = X[:R].astype(np.float64), X_test[:500].astype(np.float64)
    lam = N * WEIGHT_DECAY
    for name, (structure, subset) in POSTHOC.items():
        cfg = laplace.LaplaceConfig(prior_precision=lam, structure=structure, curvature="ggn",
                                    subset=subset)
        t = time.perf_counter()
        state = laplace_state(net, theta, X, y[:R], cfg)
        t_fit = time.perf_counter() - t
        t = time.perf_counter()
        evidence_tuned(net, state, X, y[:R], cfg)
        t_ev = time.perf_counter() - t
        eps = np.random.default_rng(SEED).standard_normal((net.D - state.n_fixed, 1))
        t = time.perf_counter()
        linearized_bma(net, theta, laplace.sample(state, eps), X_test)
        t_draw = (time.perf_counter() - t) * 10000 / X_test.shape[0]
        print(f"{name:<14} float64: fit {t_fit:.1f} s on {R} rows -> {t_fit * N / R:.0f} s on "
              f"{N}; evidence {t_ev:.1f} s; fit + evidence {t_fit * N / R + t_ev:.0f} s; one "
              f"GLM draw over 10,000 test rows {t_draw:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per case (default 20)")
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    ap.add_argument("--cases", nargs="+", default=None,
                    help="runner rows (and sgd) to time (default all)")
    ap.add_argument("--laplace-rows", type=int, default=2000,
                    help="training rows of the Laplace timing (default 2000; 0: skip)")
    args = ap.parse_args()
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1)
    except ImportError:
        pass

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    data = load_cifar10(dtype=np.float32)
    X_all = normalize(data.X_train).reshape(N, -1)
    X_test = normalize(data.X_test[:500]).reshape(500, -1)
    y_all = data.y_train
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"CIFAR-10 loaded and normalized in {time.perf_counter() - t0:.1f} s")

    net = lenet5()
    rounds = WARMUP + args.steps
    perm = np.random.default_rng(SEED).permutation(N)
    cases, times, fwd = {}, {}, {}
    for i, dtype in enumerate(args.dtypes):
        cs, theta0 = make_cases(net, dtype, np.random.default_rng(SEED + 1 + i),
                                args.cases or (*CASES, "sgd"))
        Xd = X_all.astype(dtype)
        for name, (M, fn) in cs.items():
            batches = [Batch(np.ascontiguousarray(Xd[perm[(r * M) % (N - M):][:M]]),
                             y_all[perm[(r * M) % (N - M):][:M]]) for r in range(rounds)]
            cases[name, dtype] = (M, fn, batches)
            times[name, dtype] = []
        Xt = np.ascontiguousarray(X_test[:128].astype(dtype))
        net.forward(theta0, Xt)
        ft = []
        for _ in range(FWD_REPS):
            t = time.perf_counter()
            net.forward(theta0, Xt)
            ft.append(time.perf_counter() - t)
        fwd[dtype] = float(np.median(ft))

    keys = list(cases)
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:  # rotated: no case always first
            M, fn, batches = cases[key]
            t = time.perf_counter()
            fn(batches[r])
            if r >= WARMUP:
                times[key].append(time.perf_counter() - t)
    load1 = os.getloadavg()

    print(f"\nLeNet-5 (D = {net.D}), CIFAR-10 train rows, 1 BLAS thread; {args.steps} timed "
          f"steps per case after {WARMUP} untimed, interleaved")
    print(f"{'method':<28} {'dtype':<8} {'M':>4} {'med s/step':>11} {'mean s/step':>12} "
          f"{'steps/ep':>9} {'s/epoch':>9}")
    for (name, dtype), ts in times.items():
        M = cases[name, dtype][0]
        spe = math.ceil(N / M)
        med = float(np.median(ts))
        print(f"{name:<28} {dtype:<8} {M:>4} {med:11.4f} {float(np.mean(ts)):12.4f} "
              f"{spe:>9} {med * spe:9.1f}")
    for dtype, t in fwd.items():
        print(f"forward of 128 test rows ({dtype}): {t:.4f} s (median of {FWD_REPS}); the 10,000 "
              f"test rows: {t * 10000 / 128:.2f} s per posterior draw")
    print(f"load average at end: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} (2 cores, shared)")
    if args.laplace_rows > 0:
        time_laplace(net, X_all, y_all, X_test, args.laplace_rows)
        load2 = os.getloadavg()
        print(f"load average after the Laplace timing: {load2[0]:.2f} {load2[1]:.2f} "
              f"{load2[2]:.2f}")


if __name__ == "__main__":
    main()
