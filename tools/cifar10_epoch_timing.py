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

Data: ``load_cifar10`` (float32), the official normalization (x - mean_c) / std_c with their
constants, rows form (M, 3072). Each case gets its own minibatches from one permutation
(``numpy.random.default_rng(SEED)``); every draw (eps, dropout masks) comes from seeded
generators too. Cases run interleaved, round by round: round r takes one step of every
(method, dtype) on minibatch r, so the machine's drifts fall on all alike; the first WARMUP
rounds are not timed; the order of the cases rotates by one each round, so no case always runs
first. A step is a real training step (the state moves on).

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

from refbayes import conventions
from refbayes.datasets import load_cifar10
from refbayes.methods import (
    Batch,
    adam,
    bbb,
    driver,
    mc_dropout,
    noisy_kfac,
    swag,
    vogn,
)
from refbayes.models.conv import lenet5

N = 50000
SEED = 0
WARMUP = 2
FWD_REPS = 7
MEAN = np.array([0.4914, 0.4822, 0.4465])   # classification/main.py l.110 (official constants)
STD = np.array([0.2023, 0.1994, 0.2010])


def normalize(X):
    """(x - mean_c) / std_c per channel, the official ``transforms.Normalize``; X (n, 3, 32, 32)."""
    m = MEAN.astype(X.dtype)[None, :, None, None]
    s = STD.astype(X.dtype)[None, :, None, None]
    return (X - m) / s


def official_vogn_config():
    """The VOGNConfig of lenet_vogn_bs128_4gpu.json after its KL warm-up (tau = 1), N = 50000."""
    return conventions.from_pytorch_sso_vogn(
        dataset_size=N, lr=1e-4, momentum=0.9, momentum_type="raw",
        curv_kwargs={"ema_decay": 0.999, "damping": 1e-3}, num_mc_samples=6, kl_weighting=1.0,
        prior_variance=1e-2)


def make_cases(net, dtype, rng):
    """{name: (M, step(batch) -> None)} for one dtype; each closure keeps its own state."""
    dt = np.dtype(dtype)
    theta0 = net.init_theta(np.random.default_rng(SEED), dtype=dt)
    D = net.D
    cases = {}

    # Adam: classification/configs/cifar10/lenet_adam.json: lr 1e-3, betas (0.9, 0.999),
    # weight_decay 1e-2 on the mean loss -> lam = N wd, eps_adam = N 1e-8 on refbayes' summed loss
    st = {"a": adam.init(theta0.copy())}
    cfg_a = adam.AdamConfig(alpha=1e-3, beta1=0.9, beta2=0.999, eps_adam=N * 1e-8)

    def adam_step(batch):
        st["a"], _ = adam.step(st["a"], batch, cfg_a, net, N, N * 1e-2)
    cases["Adam"] = (128, adam_step)

    # VOGN: distributed/.../lenet_vogn_bs128_4gpu.json: 4 x 32 rows, 6 draws per process,
    # lr 1e-4, raw momentum 0.9, ema_decay 0.999, damping 1e-3, prior_variance 1e-2, tau 1.
    # refbayes runs it as one step on the 128 rows with S = 6 (same per-example work).
    cfg_v = official_vogn_config()
    st["v"] = vogn.init(theta0.copy(), np.full(D, 1e-2, dtype=dt))

    def vogn_step(batch):
        eps = rng.standard_normal((D, 6)).astype(dt)
        st["v"], _ = vogn.step(st["v"], batch, eps, cfg_v, net)
    cases["VOGN (S=6, ef)"] = (128, vogn_step)

    # BBB: not in the public code; refbayes' choice (note): Adam lr 1e-3 on (mu, rho), S = 1,
    # prior precision 100 (VOGN's), sigma_0 = 1e-3
    cfg_b = bbb.BBBConfig(N, 100.0, alpha=1e-3, eps_adam=N * 1e-8)
    st["b"] = bbb.init(theta0.copy(), sigma0=1e-3)

    def bbb_step(batch):
        eps = rng.standard_normal((D, 1)).astype(dt)
        st["b"], _ = bbb.step(st["b"], batch, eps, cfg_b, net)
    cases["BBB (S=1)"] = (128, bbb_step)

    # MC dropout: LeNet5MCDropout's p = 0.1; Adam as the Adam row (no public config)
    lam_d = N * 1e-2
    cfg_d = mc_dropout.MCDropoutConfig(N, p=0.1, lengthscale=math.sqrt(lam_d * 0.9), alpha=1e-3,
                                       eps_adam=N * 1e-8)
    st["d"] = mc_dropout.init(theta0.copy())

    def dropout_step(batch):
        masks = driver.draw_masks(rng, net, batch.X.shape[0], 0.1, dtype=dt)
        st["d"], _ = mc_dropout.step(st["d"], batch, masks, cfg_d, net)
    cases["MC dropout (p=0.1)"] = (128, dropout_step)

    # K-FAC: classification/configs/cifar10/lenet_kfac.json: lr 1e-3, momentum 0.9, damping
    # 1e-3, ema_decay 0.999 (weight of the new statistics), curvature and inverse every step
    cfg_k = noisy_kfac.NoisyKFACConfig(N, eta=1.0 / (N * 1e-3), kl_weight=1.0, alpha=1e-3,
                                       beta=0.999, momentum=0.9, gamma_ex=1e-3, T_stats=1,
                                       T_inv=1, curvature="ggn")
    st["k"] = noisy_kfac.init(theta0.copy(), net)

    def kfac_step(batch):
        st["k"], _ = noisy_kfac.step(st["k"], batch, None, cfg_k, net)
    cases["K-FAC (T_inv=1)"] = (128, kfac_step)

    # Noisy K-FAC: classification/configs/cifar10/lenet_noisykfac.json: batch 64, 4 draws,
    # lr 4e-3, momentum 0.9, kl_weighting 0.2, prior_variance 1, damping 1e-4, ema_decay 0.333
    cfg_n = noisy_kfac.NoisyKFACConfig(N, eta=1.0, kl_weight=0.2, alpha=4e-3, beta=0.333,
                                       momentum=0.9, gamma_ex=1e-4, T_stats=1, T_inv=1,
                                       curvature="ggn")
    st["n"] = noisy_kfac.init(theta0.copy(), net)

    def nkfac_step(batch):
        eps = rng.standard_normal((D, 4)).astype(dt)
        st["n"], _ = noisy_kfac.step(st["n"], batch, eps, cfg_n, net)
    cases["Noisy K-FAC (S=4, T_inv=1)"] = (64, nkfac_step)

    # SWAG's SGD: distributed/.../lenet_sgd_bs128_4gpu.json: lr 1e-3, momentum 0.9, wd 1e-2
    cfg_s = swag.SGDConfig(N=N, lam=N * 1e-2, alpha=1e-3 / N, momentum=0.9)
    st["s"] = swag.sgd_init(theta0.copy())

    def sgd_step(batch):
        st["s"], _ = swag.sgd_step(st["s"], batch, None, cfg_s, net)
    cases["SGD (SWAG's base)"] = (128, sgd_step)
    return cases, theta0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per case (default 20)")
    ap.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
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
    X_test = normalize(data.X_test[:128]).reshape(128, -1)
    y_all = data.y_train
    print(f"load average at start: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"CIFAR-10 loaded and normalized in {time.perf_counter() - t0:.1f} s")

    net = lenet5()
    rounds = WARMUP + args.steps
    perm = np.random.default_rng(SEED).permutation(N)
    cases, times, fwd = {}, {}, {}
    for i, dtype in enumerate(args.dtypes):
        cs, theta0 = make_cases(net, dtype, np.random.default_rng(SEED + 1 + i))
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


if __name__ == "__main__":
    main()
