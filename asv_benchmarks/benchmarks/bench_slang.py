"""One SLANG step (Algorithm 1), one full-Gaussian natural-gradient step (curvature "ef"), and the
exact-VI solve that is their ground truth.

Issue targets: the SLANG step at D = 1e4, L = 10, M = 32 (S = 1) runs in under 10 ms on one
core; SLANG scales linearly in D, the full Gaussian cubically. asv times whatever BLAS threading
the process starts with; for the one-core figures run with the thread count fixed in the
environment (threadpoolctl is not a dependency, and OpenBLAS reads these once, at import):

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 asv run --python=same -b bench_slang

``python -m benchmarks.bench_slang`` (from asv_benchmarks/) prints the median step time and the
page faults per step of every case with timeit, on the same inputs, each in a fresh process.

Allocation matters here: at D = 1e4 a SLANG step allocates ~7 MiB of fresh temporaries (W, G,
(D, L) products), which glibc maps and unmaps every step; first-touch page faults are about half
the step time in a fresh process (the figure asv reports), less after larger allocations have
raised malloc's thresholds.

Step inputs: logistic regression with an intercept (D - 1 features + 1), a minibatch of M = 32
rows standing for N = 1000, the state at a non-trivial point (mu, U, d drawn once, t = 10), and
eps (D, 1). Only the step is timed: the state, batch, eps and config are built in setup.
"""
import functools
import timeit

import numpy as np

from refbayes.datasets import make_logistic_regression
from refbayes.linalg import lowrank
from refbayes.methods import exact_vi, ngvi, slang
from refbayes.methods._estimates import Batch
from refbayes.models import LogisticRegression, add_intercept

from .common import BACKENDS, DENSE_MAX_D, backend, sync

DS = [100, 1000, 10000]
LS = [1, 10, 32]
M = 32          # minibatch rows
S = 1           # Monte Carlo draws per step
N = 1000        # training-set size the minibatch stands for (scales it by N / M)
T = 10          # steps already taken: step sizes alpha_t, beta_t of a running optimizer

# The SLANG paper's priors for the logistic-regression benchmarks: lam on the features, 1e-5 on
# the intercept (the last column, as add_intercept appends it).
PRIOR = {"australian": 1e-5, "a1a": 2.8072}
INTERCEPT_PRIOR = 1e-5


@functools.lru_cache(maxsize=None)
def _step_host(D, L, seed=0):
    """(X_B (M, D - 1), y_B (M,), mu (D,), U (D, L), d (D,), eps (D, S)), float64 NumPy.

    X_ij ~ N(0, 1) and w ~ N(0, I / (D - 1)) so the logits x^T w are O(1) at every D and the
    labels are not all one class; U has columns of norm ~1 and d in [0.5, 2]: a precision whose
    low-rank part matters (U = 0, the paper's start, would make fast_sample trivial)."""
    p = D - 1
    X, y, _ = make_logistic_regression(M, p, seed, prior_precision=float(p))
    rng = np.random.default_rng(seed + 1)
    mu = rng.standard_normal(D) / np.sqrt(D)
    U = rng.standard_normal((D, L)) / np.sqrt(D)
    d = rng.uniform(0.5, 2.0, D)
    eps = rng.standard_normal((D, S))
    return X, y, mu, U, d, eps


def step_inputs(xp, D, L, seed=0):
    """(model, batch, mu, U, d, eps, lam) on backend xp; lam = 1 (the SLANG prior scale)."""
    X, y, mu, U, d, eps = (xp.asarray(a) for a in _step_host(D, L, seed))
    return LogisticRegression(D - 1), Batch(X, y), mu, U, d, eps, xp.ones(D)


class SLANGStep:
    """slang.step: O(D (L + M S)^2) for fast_eig plus the per-example gradients; nothing D x D."""
    params = (BACKENDS, DS, LS)
    param_names = ["backend", "D", "L"]

    def setup(self, name, D, L):
        self.xp = backend(name)
        self.model, self.batch, mu, U, d, self.eps, lam = step_inputs(self.xp, D, L)
        self.state = slang.init(mu, U, d)._replace(t=T)
        self.cfg = slang.SLANGConfig(N=N, lam=lam, L=L)
        self.run()  # warm-up: allocations, CuPy kernel compilation
        sync(self.xp)

    def run(self):
        return slang.step(self.state, self.batch, self.eps, self.cfg, self.model)

    def time_step(self, name, D, L):
        self.run()
        sync(self.xp)

    def peakmem_step(self, name, D, L):
        self.run()


class FullGaussianStep:
    """ngvi.step_full with curvature "ef": O(D^3), two Cholesky factors of D x D precisions.

    Its precision is the SLANG state's U U^T + diag(d) at L = 10, so both start from one q."""
    params = (BACKENDS, DS)
    param_names = ["backend", "D"]
    L = 10

    def setup(self, name, D):
        if D > DENSE_MAX_D:
            # Measured on the 2-core dev machine at D = 1e4: 16-21 s per step (two Cholesky
            # factors of 1e4 x 1e4), 10 s of setup (a third one in init_full) and ~5 GB peak;
            # warm-up plus repeats exceed asv's default 60 s timeout.
            raise NotImplementedError(f"full-Gaussian step at D = {D}: O(D^3), ~20 s a step and "
                                      "~5 GB; over asv's 60 s timeout")
        self.xp = backend(name)
        self.model, self.batch, mu, U, d, self.eps, lam = step_inputs(self.xp, D, self.L)
        self.state = ngvi.init_full(mu, lowrank.dense_precision(U, d))._replace(t=T)
        self.cfg = ngvi.NGVIConfig(N=N, lam=lam, curvature="ef")
        self.run()
        sync(self.xp)

    def run(self):
        return ngvi.step_full(self.state, self.batch, self.eps, self.cfg, self.model)

    def time_step(self, name, D):
        self.run()
        sync(self.xp)

    def peakmem_step(self, name, D):
        self.run()


@functools.lru_cache(maxsize=None)
def exact_vi_problem(dataset):
    """(X~ (N, D) with the intercept column last, y (N,), lam (D,)) of the SLANG paper's setup.

    australian: all 690 rows (the paper draws a 50/50 split per seed; the solver's cost does not
    depend on which half); a1a: the 1605 training rows. Reads REFBAYES_DATA; NotImplementedError
    (asv: skip) when the files are not there."""
    from refbayes.datasets import load_a1a, load_australian
    try:
        if dataset == "australian":
            X, y = load_australian()
        else:
            X, y = load_a1a()[:2]
    except FileNotFoundError as err:  # a file that is there but wrong still raises
        first_line = str(err).splitlines()[0]
        raise NotImplementedError(f"{first_line}; set REFBAYES_DATA") from None
    Xd = add_intercept(X)
    lam = np.full(Xd.shape[1], PRIOR[dataset])
    lam[-1] = INTERCEPT_PRIOR
    return Xd, y, lam


@functools.lru_cache(maxsize=None)
def _exact_vi_fit(dataset):
    return exact_vi.fit_full(*exact_vi_problem(dataset))


class ExactVI:
    """exact_vi.fit_full to grad_norm <= 1e-10 on the SLANG paper's logistic-regression data."""
    params = (["australian", "a1a"],)
    param_names = ["dataset"]

    def setup(self, dataset):
        self.problem = exact_vi_problem(dataset)

    def time_fit_full(self, dataset):
        exact_vi.fit_full(*self.problem)

    def track_grad_norm(self, dataset):
        """The stopping quantity at the returned optimum (exact_vi.6); fit_full's tol is 1e-10."""
        return _exact_vi_fit(dataset).grad_norm

    track_grad_norm.unit = "grad norm"

    def track_n_iter(self, dataset):
        return _exact_vi_fit(dataset).n_iter

    track_n_iter.unit = "iterations"


# ----------------------------------------------------------------------------- without asv

def _median_ms(fn, min_time=0.5, repeat=9):
    """Median of ``repeat`` timeit samples of one call, in ms; a sample lasts >= min_time / repeat."""
    timer = timeit.Timer(fn)
    number = max(1, int(min_time / repeat / max(timer.timeit(1), 1e-9)))
    return 1e3 * float(np.median(timer.repeat(repeat=repeat, number=number))) / number


def _faults_per_call(fn, n=20):
    """Minor page faults per call: memory first touched by fresh multi-MB temporaries (Linux)."""
    try:
        import resource
    except ImportError:
        return float("nan")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / n


def _one_case(method, D, L):
    bench = SLANGStep() if method == "slang" else FullGaussianStep()
    try:
        bench.setup("numpy", D, L) if method == "slang" else bench.setup("numpy", D)
    except NotImplementedError as err:
        return f"{method:<8} {D:>6} {L:>3}  skipped: {err}"
    ms, faults = _median_ms(bench.run), _faults_per_call(bench.run)
    return f"{method:<8} {D:>6} {L:>3}  {ms:10.3f}  {faults:10.0f}"


def main(argv):
    """Each case in a fresh interpreter, as asv runs them: glibc's malloc raises its mmap and trim
    thresholds after large frees, so a step timed after bigger allocations in the same process
    page-faults less and runs faster than it does in a training loop of its own."""
    import subprocess
    import sys
    if argv:
        print(_one_case(argv[0], int(argv[1]), int(argv[2])))
        return
    print(f"{'method':<8} {'D':>6} {'L':>3}  {'ms/step':>10}  {'faults/step':>10}   (median; "
          "BLAS threads from the environment)")
    cases = ([("slang", D, L) for D in DS for L in LS]
             + [("full-ef", D, FullGaussianStep.L) for D in DS])
    for method, D, L in cases:
        cmd = [sys.executable, "-m", "benchmarks.bench_slang", method, str(D), str(L)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
