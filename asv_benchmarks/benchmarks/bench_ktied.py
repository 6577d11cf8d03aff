"""One k-tied Normal step (refbayes.methods.ktied, Swiatkowski et al. 2020) against one step of
its mean-field baseline, Bayes-by-Backprop (refbayes.methods.bbb), on the same network, batch and
draw, in the same process.

- KTiedStep: ``ktied.step`` with k = 1 and k = 3 ("ktied-1", "ktied-3") and ``bbb.step``
  ("meanfield") on MLP [784, width, width, 10] (ReLU, categorical), width in {50, 400}
  (D = 785 w + (w + 1) w + 10 (w + 1): 42,310 and 478,410), M = 128 rows, S = 1 draw,
  N = 60,000 (MNIST's training set), prior precision 1, BBBConfig defaults otherwise (Adam,
  kl_weight 1). The ktied methods come first in ``params`` so that the once-run test
  (tests/test_benchmarks.py) runs a k-tied step, and through ``track_ratio`` a mean-field one.
  Inputs (fixed seeds): X (128, 784) standard normal, labels uniform in 0..9 (seed 0); mu from
  ``model.init_theta`` (seed 0); mean field ``bbb.init(mu, rho0=-3.0)``; k-tied
  ``ktied.init(mu, model, k, sigma0=softplus(-3), xi, jitter=0.1)`` with xi (P,) standard
  normal (seed 1), the start of derivations/ktied.md (ktied.8); eps (D, 1) standard normal
  (seed 2). Every timed call steps from the same state (t = 0), as bench_bnn does.
  ``time_step`` and ``peakmem_step`` are one step; ``time_adam_update`` is Adam's update alone
  (``adam.adam_update``, checked) on a gradient of the step's size, 2 D for mean field and D + P
  for k-tied (the part of the step issue 37 item 5 measured against it; 956,820 at width 400);
  ``track_n_variational_params`` is
  ``ktied.n_variational_params`` (2 D for mean field, D + P for k-tied (ktied.10));
  ``track_ratio`` times this method's step and the mean-field step interleaved in one process
  (median of repeats) and returns the ratio (1 for "meanfield" itself); its mean-field case is
  built there, not in ``setup``, so that ``peakmem_step`` holds one method's inputs only.

One-core figures:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \\
        asv run --python=same -b bench_ktied

``python -m benchmarks.bench_ktied`` (from asv_benchmarks/) prints the median ms per step of
every method at both widths, interleaved in one process, and its ratio to the mean-field step;
``python -m benchmarks.bench_ktied profile`` adds a cProfile of each step at width 400 grouped by
stage (the one gradient pass, which also gives loss_hat; softplus / log_softplus / sigmoid, the
(ktied.6) chain, Adam, input checks).
"""
import functools

import numpy as np

from refbayes.methods import adam, bbb, ktied
from refbayes.methods._estimates import Batch
from refbayes.models import MLP

from .common import BACKENDS, backend, sync

METHODS = ["ktied-1", "ktied-3", "meanfield"]  # k-tied first: the once-run test covers ktied.step
WIDTHS = [50, 400]   # the paper's MNIST net is [784, 400, 400, 10]; 50 keeps the test short
N_IN, N_OUT = 784, 10
M = 128
S = 1
N = 60_000
LAM = 1.0
RHO0 = -3.0          # mean-field start; sigma0 = softplus(-3) = 0.0486 for the k-tied one
JITTER = 0.1


def model(width):
    return MLP([N_IN, width, width, N_OUT], "relu", "categorical")


def rank(method):
    """k of "ktied-k"; None for "meanfield" (ktied.n_variational_params' convention)."""
    if method == "meanfield":
        return None
    if method.startswith("ktied-"):
        return int(method[len("ktied-"):])
    raise ValueError(f"method: expected one of {METHODS}, got {method!r}")


@functools.lru_cache(maxsize=None)
def _batch_host(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, N_IN)), rng.integers(0, N_OUT, M)


@functools.lru_cache(maxsize=None)
def _mu_host(width):
    return model(width).init_theta(np.random.default_rng(0))


@functools.lru_cache(maxsize=None)
def _xi_host(width, k, seed=1):
    return np.random.default_rng(seed).standard_normal(ktied.layout(model(width), k).P)


@functools.lru_cache(maxsize=None)
def _eps_host(width, seed=2):
    return np.random.default_rng(seed).standard_normal((model(width).D, S))


def step_case(xp, method, width):
    """A zero-argument callable running one step of ``method`` (inputs built once)."""
    net = model(width)
    X, y = _batch_host()
    batch = Batch(xp.asarray(X), xp.asarray(y))
    mu = xp.asarray(_mu_host(width))
    eps = xp.asarray(_eps_host(width))
    cfg = bbb.BBBConfig(N, LAM)
    k = rank(method)
    if k is None:
        state = bbb.init(mu, rho0=RHO0)
        return lambda: bbb.step(state, batch, eps, cfg, net)
    sigma0 = float(bbb.softplus(np.float64(RHO0)))
    state = ktied.init(mu, net, k, sigma0, xp.asarray(_xi_host(width, k)), jitter=JITTER)
    return lambda: ktied.step(state, batch, eps, cfg, net)


class KTiedStep:
    """One k-tied step (k = 1, 3) vs one mean-field (BBB) step, MLP [784, w, w, 10], M = 128."""
    params = (BACKENDS, METHODS, WIDTHS)
    param_names = ["backend", "method", "width"]
    timeout = 300.0

    def setup(self, name, method, width):
        self.xp = backend(name)
        self.method = method
        self.net = model(width)
        self.width = width
        self.step = step_case(self.xp, method, width)
        n = ktied.n_variational_params(self.net, rank(method))
        g = self.xp.asarray(np.random.default_rng(4).standard_normal(n))
        self.adam_args = (g, adam.adam_init(g), adam.AdamConfig())
        self.baseline = None  # the mean-field case of track_ratio, built there: not in peakmem
        self.run()  # warm-up: CuPy kernels, BLAS buffers

    def run(self):
        out = self.step()
        sync(self.xp)
        return out

    def run_baseline(self):
        if self.baseline is None:
            self.baseline = step_case(self.xp, "meanfield", self.width)
            self.baseline()  # warm-up
        out = self.baseline()
        sync(self.xp)
        return out

    def time_step(self, name, method, width):
        self.run()

    def time_adam_update(self, name, method, width):
        """Adam's update alone at the step's size (2 D or D + P), (adam.1)-(adam.4)."""
        adam.adam_update(*self.adam_args)
        sync(self.xp)

    def peakmem_step(self, name, method, width):
        self.run()

    def track_n_variational_params(self, name, method, width):
        """2 D (mean field) or D + P (k-tied), (ktied.10)."""
        return ktied.n_variational_params(self.net, rank(method))

    track_n_variational_params.unit = "parameters"

    def per_step_ms(self, repeat=5):
        """(this method, mean field) ms per step, one entry per timing, interleaved."""
        import timeit
        self.run_baseline()  # builds and warms the mean-field case
        number = max(1, int(0.02 / max(timeit.timeit(self.run, number=1), 1e-9)))
        t_m, t_mf = [], []
        for _ in range(repeat):
            t_m.append(1e3 * timeit.timeit(self.run, number=number) / number)
            t_mf.append(1e3 * timeit.timeit(self.run_baseline, number=number) / number)
        return np.array(t_m), np.array(t_mf)

    def track_ratio(self, name, method, width):
        """Median step of this method / median mean-field step, interleaved (1 for meanfield)."""
        if self.method == "meanfield":
            return 1.0
        t_m, t_mf = self.per_step_ms(repeat=5)
        return float(np.median(t_m) / np.median(t_mf))

    track_ratio.unit = "x mean-field step"


# ----------------------------------------------------------------------------- without asv

# Profile stages: label -> predicate on (module basename, function name) of a profiled function.
STAGES = [
    ("pass + loss_hat (sample_losses_and_grads)",
     lambda mod, fn: fn == "sample_losses_and_grads"),
    ("softplus/log_softplus/sigmoid (all calls)",
     lambda mod, fn: mod == "bbb" and fn in ("softplus", "log_softplus", "_sigmoid",
                                             "_log_sigmoid")),
    ("  bbb KL + KL grads (bbb._kl, _kl_grads)",
     lambda mod, fn: mod == "bbb" and fn in ("_kl", "_kl_grads")),
    ("  ktied sigma = U V^T (ktied._sigma)", lambda mod, fn: mod == "ktied" and fn == "_sigma"),
    ("  ktied log sigma (ktied._log_sigma)",
     lambda mod, fn: mod == "ktied" and fn == "_log_sigma"),
    ("  ktied KL (ktied._kl)", lambda mod, fn: mod == "ktied" and fn == "_kl"),
    ("  ktied chain (ktied.6) (ktied._chain)", lambda mod, fn: mod == "ktied" and fn == "_chain"),
    ("Adam (adam._adam)", lambda mod, fn: mod == "adam" and fn == "_adam"),
    ("input checks (check_*, _check_*)", lambda mod, fn: fn.startswith(("check_", "_check_"))),
]


def _key(func):
    path, _, fn = func
    return path.rsplit("/", 1)[-1].removesuffix(".py"), fn


def _stage_times(stats):
    """{label: seconds}: for each stage, the cumulative time of its functions counted at their
    outermost call (calls from another function of the same stage are not added twice). Stages
    overlap: the softplus row includes the softplus calls made inside the indented rows."""
    out = {}
    for label, match in STAGES:
        total = 0.0
        for func, (_, _, _, _, callers) in stats.stats.items():
            if match(*_key(func)):
                total += sum(c[3] for caller, c in callers.items() if not match(*_key(caller)))
        out[label] = total
    return out


def profile_steps(width=400, n=20, methods=("meanfield", "ktied-1", "ktied-3")):
    """cProfile of n steps of each method (numpy), grouped by stage; ms per step."""
    import cProfile
    import pstats
    rows = {}
    for method in methods:
        fn = step_case(np, method, width)
        fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        stats = pstats.Stats(prof)
        rows[method] = ({k: 1e3 * v / n for k, v in _stage_times(stats).items()},
                        1e3 * stats.total_tt / n)
    print(f"\ncProfile, width {width}, {n} steps each, cumulative ms per step by stage "
          "(profiler overhead included)")
    print(f"{'stage':<44}" + "".join(f"{m:>11}" for m in methods))
    for label, _ in STAGES:
        print(f"{label:<44}" + "".join(f"{rows[m][0][label]:11.2f}" for m in methods))
    print(f"{'total (profiled)':<44}" + "".join(f"{rows[m][1]:11.2f}" for m in methods))


def main(profile=False, rounds=25):
    """Median ms per step of every method and width, interleaved in one process, and the ratio
    to the mean-field step of the same width."""
    import time
    for width in WIDTHS:
        cases = {m: step_case(np, m, width) for m in ("meanfield", "ktied-1", "ktied-3")}
        for fn in cases.values():  # warm-up
            fn()
            fn()
        times = {m: [] for m in cases}
        for _ in range(rounds):
            for m, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[m].append(time.perf_counter() - t0)
        D = model(width).D
        print(f"\nMLP [784, {width}, {width}, 10], D = {D}, M = {M}, S = {S}: median of {rounds} "
              "interleaved steps (BLAS threads: REFBAYES_BENCH_THREADS, default 1)")
        print(f"{'method':<11} {'ms/step':>9} {'min ms':>8} {'x meanfield':>12} {'# params':>10}")
        ref = np.median(times["meanfield"])
        for m, ts in times.items():
            med = np.median(ts)
            print(f"{m:<11} {1e3 * med:9.3f} {1e3 * min(ts):8.3f} {med / ref:12.2f} "
                  f"{ktied.n_variational_params(model(width), rank(m)):>10}")
    if profile:
        profile_steps()


if __name__ == "__main__":
    import sys
    main(profile="profile" in sys.argv[1:])
