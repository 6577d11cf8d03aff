"""One step of each Bayesian-neural-network method of issue 4 on a 50-unit MLP with kin8nm-sized
inputs (8 features, one output, D = 8*50 + 50 + 50 + 1 = 501), M in {32, 128}, S (the papers' K)
in {1, 10}; and one epoch of VOGN on kin8nm itself. Beside them, VOGNMnistStep: VOGN ("ef",
"ggn") at S in {1, 3, 10, 30} and Adam on the MNIST MLP [784, 100, 10], M = 128 (issue 37).

Issue target: a VOGN step costs at most 3x an Adam step on the same network and batch,
per-example gradients included, and the per-example path is numba / vectorized (never the
autograd loop). Adam and MC dropout draw no Gaussian samples, so their S = 10 cases are skipped.

``python -m benchmarks.bench_bnn`` (from asv_benchmarks/) times every method in one process,
interleaved, and prints each step time with its ratio to the Adam step of the same M: ratios
from one run, since the machines are noisy.

Step inputs: X_B (M, 8), y_B (M,) standard normal (benchmarks.common.regression_batch) standing
for N = 7373 rows (kin8nm's 90% training split); theta from the model's Glorot initializer
(seed 0); the Gaussian states at sigma ~ 1e-2 (s from a precision N s ~ 1e4), t = 10.
"""
import functools

import numpy as np

from refbayes.methods import adam, bbb, mc_dropout, noisy_adam, slang, vadam, vogn
from refbayes.methods._estimates import Batch
from refbayes.methods.driver import draw_masks, run
from refbayes.models import MLP

from .common import BACKENDS, backend, interleaved_medians, regression_batch, sync

N = 7373        # kin8nm training rows (90% of 8192)
WIDTH = 50
LAM = 1.0       # prior precision
T = 10          # steps already taken
S0 = 1e4 / N    # s such that N s = 1e4: sigma ~ 1e-2, a trained-looking posterior
METHODS = ["adam", "vogn-ef", "vogn-ggn", "vadam", "noisy-adam", "bbb", "mc-dropout", "slang-1"]
NO_SAMPLES = {"adam", "mc-dropout"}


def model():
    return MLP([8, WIDTH, 1], "relu", "gaussian", noise_precision=1.0)


@functools.cache
def _theta_host():
    return model().init_theta(np.random.default_rng(0))


def _state(xp, method, D):
    """(state, cfg, step fn) of ``method`` at the benchmark point, on backend xp."""
    mu = xp.asarray(_theta_host())
    s = xp.full(D, S0)
    if method == "adam":
        st = adam.init(mu)._replace(t=T)
        cfg = adam.AdamConfig()
        return st, cfg, lambda st, b, e, c, m: adam.step(st, b, c, m, N, LAM)
    if method.startswith("vogn"):
        st = vogn.init(mu, s)._replace(t=T)
        return st, vogn.VOGNConfig(N, LAM, curvature=method[5:]), vogn.step
    if method == "vadam":
        return vadam.init(mu, s)._replace(t=T), vadam.VadamConfig(N, LAM), vadam.step
    if method == "noisy-adam":
        return (noisy_adam.init(mu, s)._replace(t=T), noisy_adam.NoisyAdamConfig(N, LAM),
                noisy_adam.step)
    if method == "bbb":
        st = bbb.init(mu, sigma0=xp.full(D, 1e-2))._replace(t=T)
        return st, bbb.BBBConfig(N, LAM), bbb.step
    if method == "mc-dropout":
        return mc_dropout.init(mu), mc_dropout.MCDropoutConfig(N, p=0.05), mc_dropout.step
    if method == "slang-1":
        U = xp.zeros((D, 1))
        st = slang.init(mu, U, xp.full(D, N * S0))._replace(t=T)
        return st, slang.SLANGConfig(N, xp.full(D, LAM), L=1), slang.step
    raise ValueError(f"method: expected one of {METHODS}, got {method!r}")


def step_case(xp, method, M, S):
    """A zero-argument callable running one step of ``method`` (inputs built once)."""
    net = model()
    X, y = regression_batch(xp, M)
    batch = Batch(X, y)
    state, cfg, step = _state(xp, method, net.D)
    if method == "mc-dropout":
        noise = [xp.asarray(z) for z in draw_masks(np.random.default_rng(1), net, M, cfg.p)]
    elif method == "adam":
        noise = None
    else:
        noise = xp.asarray(np.random.default_rng(1).standard_normal((net.D, S)))
    return lambda: step(state, batch, noise, cfg, net)


def core_case(xp, curvature, M, S):
    """A zero-argument callable computing VOGN's per-sample moments (vogn.5), the model's one
    batched pass over the S draws theta_k = mu + sigma eps_k at the benchmark point: the part of
    a VOGN step no step overhead can remove, its floor."""
    net = model()
    X, y = regression_batch(xp, M)
    state, cfg, step = _state(xp, f"vogn-{curvature}", net.D)
    eps = xp.asarray(np.random.default_rng(1).standard_normal((net.D, S)))
    thetas = xp.ascontiguousarray(step(state, Batch(X, y), eps, cfg, net)[1].theta.T)  # step_case's draws
    return lambda: net.sample_moments(thetas, X, y, curvature)


class BNNStep:
    """One step per method, 50-unit MLP, kin8nm-sized inputs: ratio to "adam" is the figure."""
    params = (BACKENDS, METHODS, [32, 128], [1, 10])
    param_names = ["backend", "method", "M", "S"]

    def setup(self, name, method, M, S):
        if method in NO_SAMPLES and S > 1:
            raise NotImplementedError(f"{method} draws no Gaussian samples: S does not apply")
        self.xp = backend(name)
        self.run = step_case(self.xp, method, M, S)
        self.run()  # warm-up: numba compilation or cache load, CuPy kernels
        sync(self.xp)

    def time_step(self, name, method, M, S):
        self.run()
        sync(self.xp)


@functools.cache
def kin8nm_split0():
    """(X, y) of kin8nm split 0's training rows, standardized with their own statistics
    (REFBAYES_DATA; NotImplementedError, asv's skip, when the files are not there)."""
    from refbayes.datasets import load_uci, standardize
    try:
        X, y, Xt, yt = load_uci("kin8nm", 0)
    except FileNotFoundError as err:
        raise NotImplementedError(f"{str(err).splitlines()[0]}; set REFBAYES_DATA") from None
    scaled = standardize(X, y, Xt, yt)[0]
    return scaled.X_train, scaled.y_train


class VOGNCore:
    """VOGN's per-sample moments alone (core_case): the floor of a VOGN step of the same M, S."""
    params = (BACKENDS, ["ef", "ggn"], [32, 128], [1, 10])
    param_names = ["backend", "curvature", "M", "S"]

    def setup(self, name, curvature, M, S):
        self.xp = backend(name)
        self.run = core_case(self.xp, curvature, M, S)
        self.run()
        sync(self.xp)

    def time_core(self, name, curvature, M, S):
        self.run()
        sync(self.xp)


class VOGNEpoch:
    """One epoch of VOGN (S = 1, "ef" and "ggn") on kin8nm split 0: ceil(7373 / M) steps with the
    driver's shuffling and draws."""
    params = (["ef", "ggn"], [32, 128])
    param_names = ["curvature", "M"]

    def setup(self, curvature, M):
        self.X, self.y = kin8nm_split0()
        self.net = model()
        theta = self.net.init_theta(np.random.default_rng(0))
        self.state = vogn.init(theta, np.full(self.net.D, S0))
        self.cfg = vogn.VOGNConfig(self.X.shape[0], LAM, alpha=1e-3, curvature=curvature)

    def time_epoch(self, curvature, M):
        run(self.state, self.cfg, self.net, self.X, self.y, rng=np.random.default_rng(0),
            epochs=1, M=M, S=1)


# ----------------------------------------------------------------------------- the MNIST MLP

MNIST_SIZES = [784, 100, 10]
MNIST_N = 60000   # MNIST training rows
MNIST_M = 128
MNIST_S = [1, 3, 10, 30]


def mnist_model():
    return MLP(MNIST_SIZES, "relu", "categorical")


@functools.cache
def _mnist_host(M):
    """(X (M, 784) standard normal, y (M,) labels in 0..9, Glorot theta), seed 0."""
    rng = np.random.default_rng(0)
    return (rng.standard_normal((M, MNIST_SIZES[0])), rng.integers(0, MNIST_SIZES[-1], M),
            mnist_model().init_theta(np.random.default_rng(0)))


def mnist_case(xp, method, S, M=MNIST_M):
    """One step of "adam", "vogn-ef" or "vogn-ggn" on the MNIST MLP [784, 100, 10] (D = 79510),
    float64, N = 60000, a Glorot theta, the VOGN state at N s = 1e4 and t = 10 (as the tiny net's)."""
    net = mnist_model()
    X, y, theta = (xp.asarray(a) for a in _mnist_host(M))
    batch = Batch(X, y)
    if method == "adam":
        st, cfg = adam.init(theta)._replace(t=T), adam.AdamConfig()
        return lambda: adam.step(st, batch, cfg, net, MNIST_N, LAM)
    st = vogn.init(theta, xp.full(net.D, 1e4 / MNIST_N))._replace(t=T)
    cfg = vogn.VOGNConfig(MNIST_N, LAM, curvature=method[5:])
    eps = xp.asarray(np.random.default_rng(1).standard_normal((net.D, S)))
    return lambda: vogn.step(st, batch, eps, cfg, net)


class VOGNMnistStep:
    """One VOGN step ("ef", "ggn") at S in {1, 3, 10, 30} beside one Adam step on the MNIST MLP
    [784, 100, 10], M = 128 (issue 37 item 3): the ratio to "adam" is the figure, S = 1 at most
    1.3x Adam for "ef", and S draws at most S times the S = 1 step."""
    params = (BACKENDS, ["adam", "vogn-ef", "vogn-ggn"], MNIST_S)
    param_names = ["backend", "method", "S"]

    def setup(self, name, method, S):
        if method == "adam" and S > 1:
            raise NotImplementedError("adam draws no Gaussian samples: S does not apply")
        self.xp = backend(name)
        self.run = mnist_case(self.xp, method, S)
        self.run()
        sync(self.xp)

    def time_step(self, name, method, S):
        self.run()
        sync(self.xp)


# ----------------------------------------------------------------------------- without asv

def main():
    """Every method's step, interleaved in one process (9 rounds, median), and its ratio to the
    Adam step of the same M: the issue's VOGN <= 3x Adam target is read off this table. Twice:
    as a user's direct call (every check) and as the drivers take steps after the first
    (``refbayes.unchecked()``); the "vogn-*-core" rows are VOGN's per-sample moments alone."""
    import refbayes
    cases = {(m, M, S): step_case(np, m, M, S) for M in (32, 128) for S in (1, 10)
             for m in METHODS if not (m in NO_SAMPLES and S > 1)}
    cases.update({(f"vogn-{c}-core", M, S): core_case(np, c, M, S)
                  for M in (32, 128) for S in (1, 10) for c in ("ef", "ggn")})
    checked = interleaved_medians(cases, rounds=9, min_time=0.02)
    with refbayes.unchecked():
        driven = interleaved_medians(cases, rounds=9, min_time=0.02)
    print(f"{'method':<14} {'M':>4} {'S':>3} {'checked ms':>10} {'x adam':>7} {'driven ms':>10} "
          f"{'x adam':>7}   (median of 9; BLAS threads: REFBAYES_BENCH_THREADS, default 1)")
    for key in sorted(cases, key=lambda k: (k[1], k[2])):
        m, M, S = key
        c, d = checked[key], driven[key]
        print(f"{m:<14} {M:>4} {S:>3} {1e3 * c:10.3f} {c / checked['adam', M, 1]:7.2f} "
              f"{1e3 * d:10.3f} {d / driven['adam', M, 1]:7.2f}")
    mnist = {(m, S): mnist_case(np, m, S) for m in ("adam", "vogn-ef", "vogn-ggn")
             for S in MNIST_S if not (m == "adam" and S > 1)}
    checked = interleaved_medians(mnist, rounds=9, min_time=0.05)
    with refbayes.unchecked():
        driven = interleaved_medians(mnist, rounds=9, min_time=0.05)
    print(f"\nMNIST MLP {MNIST_SIZES}, M = {MNIST_M}: x adam, and x (S times the S = 1 step)")
    print(f"{'method':<14} {'S':>3} {'checked ms':>10} {'x adam':>7} {'x S*S1':>7} {'driven ms':>10} "
          f"{'x adam':>7} {'x S*S1':>7}")
    for (m, S), c in mnist.items():
        c, d = checked[m, S], driven[m, S]
        print(f"{m:<14} {S:>3} {1e3 * c:10.3f} {c / checked['adam', 1]:7.2f} "
              f"{c / (S * checked[m, 1]):7.2f} {1e3 * d:10.3f} {d / driven['adam', 1]:7.2f} "
              f"{d / (S * driven[m, 1]):7.2f}")


if __name__ == "__main__":
    main()
