"""One SLANG step (Algorithm 1), one full-Gaussian natural-gradient step (curvature "ef"), and the
exact-VI solve that is their ground truth.

Issue targets: the SLANG step at D = 1e4, L = 10, M = 32 (S = 1) runs in under 10 ms on one
core; SLANG scales linearly in D, the full Gaussian cubically. The benchmark package limits
BLAS to one thread (benchmarks/__init__.py; REFBAYES_BENCH_THREADS to change it).

The driven step (``SLANGStepUnchecked``: inside ``refbayes.unchecked()``, as the drivers take
every step after their first) is compared with its floor, ``SLANGStepPlain``: the same arithmetic
written plainly in NumPy for logistic regression, with no checks, no Info and no sign fixing
(its setup checks that it equals slang.step to 1e-10). ``SLANGStepParts`` times the three pieces of
the step that differ from the floor (fast_sample, fast_eig with its sign fix, the Woodbury solve:
refbayes.linalg.lowrank against the floor's plain lines) and the copy of G into W^T.
``SLANGMnistStep`` (issue 37): the driven step on the MNIST MLP [784, 100, 10], M = 128, beside
Adam, its floor ``plain_step_model`` (per-example gradients written into W^T with ``out=``) and
the floor's parts. Figures: derivations/slang_experiments.md.

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

import refbayes
from refbayes.datasets import make_logistic_regression
from refbayes.linalg import lowrank
from refbayes.methods import adam, exact_vi, ngvi, slang
from refbayes.methods._estimates import Batch
from refbayes.models import MLP, LogisticRegression, add_intercept

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


class SLANGStepUnchecked(SLANGStep):
    """slang.step inside refbayes.unchecked(): the step a driver takes after its first."""

    def run(self):
        with refbayes.unchecked():
            return slang.step(self.state, self.batch, self.eps, self.cfg, self.model)


def _plain_update(W_T, G, mu, d, lam, c, L, alpha_t, beta_t):
    """The floor steps' shared tail, once the per-example gradients G are in W^T's rows: the
    gradient, the scaling of G, the exact fast_eig, the new diagonal and the Woodbury solve.
    Returns (mu, U, d) of the new state."""
    g = c * G.sum(axis=(0, 1)) + lam * mu
    G *= np.sqrt(beta_t * c)
    _, R = np.linalg.eigh(W_T @ W_T.T)
    U_new = W_T.T @ R[:, ::-1][:, :L]
    d_new = (1.0 - beta_t) * d + np.einsum("kd,kd->d", W_T, W_T) \
        - np.einsum("dl,dl->d", U_new, U_new) + beta_t * lam
    Vn = U_new / d_new[:, None]
    cap = np.eye(L) + U_new.T @ Vn
    Delta = g / d_new - Vn @ np.linalg.solve(cap, Vn.T @ g)       # Woodbury (lowrank.2)
    return mu - alpha_t * Delta, U_new, d_new


def plain_step(state, X, y, eps, lam, N, alpha_t, beta_t):
    """SLANG's step on logistic regression in plain NumPy: the floor of ``slang.step``.

    The arithmetic of (slang.2)-(slang.8) with momentum 0 and the exact fast_eig, written for
    speed (W^T filled in place, the intercept column never materialised), with nothing else: no
    checks, no Info, no sign fixing. Returns (mu, U, d) of the new state."""
    mu, U, d = state.mu, state.U, state.d
    (M, p), S, L = X.shape, eps.shape[1], U.shape[1]
    D = p + 1
    s = np.sqrt(d)
    V = U / s[:, None]
    lam_v, Q = np.linalg.eigh(V.T @ V)
    F = (Q * (1.0 / (lam_v + 1.0 + np.sqrt(lam_v + 1.0)))) @ Q.T  # (lowrank.8)
    theta = mu[:, None] + (eps - V @ (F @ (V.T @ eps))) / s[:, None]
    r = 1.0 / (1.0 + np.exp(-(X @ theta[:-1] + theta[-1]))) - y[:, None]  # (M, S) residuals
    c = N / (M * S)
    W_T = np.empty((L + M * S, D))
    np.multiply(U.T, np.sqrt(1.0 - beta_t), out=W_T[:L])
    G = W_T[L:].reshape(S, M, D)                                   # per-example gradients
    np.multiply(r.T[:, :, None], X[None], out=G[:, :, :p])
    G[:, :, p] = r.T
    return _plain_update(W_T, G, mu, d, lam, c, L, alpha_t, beta_t)


class SLANGStepPlain:
    """``plain_step``: the floor the driven SLANG step is measured against (NumPy only)."""
    params = ([10000],  LS)
    param_names = ["D", "L"]

    def setup(self, D, L):
        model, batch, mu, U, d, self.eps, self.lam = step_inputs(np, D, L)
        self.X, self.y = batch
        self.state = slang.init(mu, U, d)._replace(t=T)
        cfg = slang.SLANGConfig(N=N, lam=self.lam, L=L)
        self.alpha_t, self.beta_t = slang.step(self.state, batch, self.eps, cfg, model)[1][:2]
        new = slang.step(self.state, batch, self.eps, cfg, model)[0]
        mine = self.run()
        err = float(np.max(np.abs(mine[0] - new.mu)) / np.max(np.abs(new.mu)))
        if not err <= 1e-10:  # the floor must be the same arithmetic
            raise ValueError(f"plain_step differs from slang.step: mu rel err {err:.2e}")

    def run(self):
        return plain_step(self.state, self.X, self.y, self.eps, self.lam, N, self.alpha_t,
                          self.beta_t)

    def time_step(self, D, L):
        self.run()


def _sign_fix(V):
    """The arithmetic of lowrank's sign fix on NumPy without ties: each column's largest-|entry|
    made >= 0 from two column reductions of the C-ordered (D, L) V, in place."""
    top, bottom = V.max(axis=0), V.min(axis=0)
    V *= np.where(top >= -bottom, 1.0, -1.0)
    return V


class SLANGStepParts:
    """The pieces of ``slang.step`` that differ from ``plain_step`` (D = 1e4): refbayes.linalg.lowrank's
    sample, top_eig (with ``_fix_signs``) and solve beside the floor's lines for each, the sign fix
    alone, and the copy of the scaled G into W^T (slang.2) that writing G there directly would save."""
    params = ([10000], LS, ["sample", "plain-sample", "top_eig", "plain-eig", "fix_signs", "solve",
                            "plain-solve", "G-to-W_T"])
    param_names = ["D", "L", "part"]

    def setup(self, D, L, part):
        model, batch, mu, U, d, eps, lam = step_inputs(np, D, L)
        state = slang.init(mu, U, d)._replace(t=T)
        new, info = slang.step(state, batch, eps, slang.SLANGConfig(N=N, lam=lam, L=L), model)
        W_T, Un, dn, g = np.ascontiguousarray(info.W.T), new.U, new.d, info.g_tilde
        G = info.G.reshape(-1, D)

        def plain_sample():
            s = np.sqrt(d)
            V = U / s[:, None]
            lam_v, Q = np.linalg.eigh(V.T @ V)
            F = (Q * (1.0 / (lam_v + 1.0 + np.sqrt(lam_v + 1.0)))) @ Q.T  # (lowrank.8)
            return mu[:, None] + (eps - V @ (F @ (V.T @ eps))) / s[:, None]

        def plain_eig():
            _, R = np.linalg.eigh(W_T @ W_T.T)
            return W_T.T @ R[:, ::-1][:, :L]

        def plain_solve():
            Vn = Un / dn[:, None]
            return g / dn - Vn @ np.linalg.solve(np.eye(L) + Un.T @ Vn, Vn.T @ g)

        self.run = {"sample": lambda: lowrank.sample(mu, U, d, eps), "plain-sample": plain_sample,
                    "top_eig": lambda: lowrank.top_eig(info.W, L), "plain-eig": plain_eig,
                    "fix_signs": lambda: _sign_fix(Un.copy()),
                    "solve": lambda: lowrank.solve(Un, dn, g), "plain-solve": plain_solve,
                    "G-to-W_T": lambda: np.multiply(G, 0.5, out=W_T[L:])}[part]

    def time_part(self, D, L, part):
        self.run()


def plain_step_model(state, model, X, y, eps, lam, N, alpha_t, beta_t):
    """``plain_step`` for any FlatModel (the MLP): its floor, with the model's per-example
    gradients written straight into the rows of W^T (``out=``) and scaled there in place.

    The same arithmetic as ``plain_step`` otherwise (momentum 0, exact fast_eig, no checks, no
    Info, no sign fixing). Returns (mu, U, d) of the new state."""
    mu, U, d = state.mu, state.U, state.d
    M, S, L, D = X.shape[0], eps.shape[1], U.shape[1], mu.shape[0]
    s = np.sqrt(d)
    V = U / s[:, None]
    lam_v, Q = np.linalg.eigh(V.T @ V)
    F = (Q * (1.0 / (lam_v + 1.0 + np.sqrt(lam_v + 1.0)))) @ Q.T  # (lowrank.8)
    theta = mu[:, None] + (eps - V @ (F @ (V.T @ eps))) / s[:, None]
    c = N / (M * S)
    W_T = np.empty((L + M * S, D))
    np.multiply(U.T, np.sqrt(1.0 - beta_t), out=W_T[:L])
    G = W_T[L:].reshape(S, M, D)
    if S == 1:
        model.per_example_grads(np.ascontiguousarray(theta[:, 0]), X, y, out=G[0])
    else:
        model.per_example_grads_batched(np.ascontiguousarray(theta.T), X, y, out=G)
    return _plain_update(W_T, G, mu, d, lam, c, L, alpha_t, beta_t)


MNIST_SIZES = [784, 100, 10]
MNIST_N = 60000


@functools.lru_cache(maxsize=None)
def _mnist_host(M, L, S, seed=0):
    """(X (M, 784), y (M,) labels, mu (D,) Glorot, U (D, L), d (D,), eps (D, S)), float64."""
    model = MLP(MNIST_SIZES, "relu", "categorical")
    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((M, MNIST_SIZES[0])), rng.integers(0, MNIST_SIZES[-1], M)
    mu = model.init_theta(np.random.default_rng(seed))
    U = rng.standard_normal((model.D, L))
    d = rng.uniform(0.5, 2.0, model.D) * 1e4
    return X, y, mu, U, d, rng.standard_normal((model.D, S))


def mnist_case(method, L=1, S=1, M=128):
    """A zero-argument callable: one step of ``method`` on the MNIST MLP [784, 100, 10]
    (D = 79510), M = 128, N = 60000, float64, NumPy. "adam": adam.step (checked); "slang":
    slang.step inside refbayes.unchecked() (driven); "plain": ``plain_step_model``, its floor;
    the parts of that floor: "peg" (per-example gradients into a fresh array), "peg-out" (into
    rows of a reused W^T), "gram" (W^T W, (L + M S)^2 D), "eigh" (of that Gram matrix),
    "U_new" (W R_L), "Delta_d" (the einsum of line 8), "sum" (sum_i g_i)."""
    model = MLP(MNIST_SIZES, "relu", "categorical")
    X, y, mu, U, d, eps = _mnist_host(M, L, S)
    lam = np.ones(model.D)
    if method == "adam":
        st, cfg = adam.init(mu)._replace(t=T), adam.AdamConfig()
        return lambda: adam.step(st, Batch(X, y), cfg, model, MNIST_N, 1.0)
    state = slang.init(mu, U, d)._replace(t=T)
    cfg = slang.SLANGConfig(N=MNIST_N, lam=lam, L=L)
    info = slang.step(state, Batch(X, y), eps, cfg, model)[1]
    if method == "slang":
        def run():
            with refbayes.unchecked():
                return slang.step(state, Batch(X, y), eps, cfg, model)
        return run
    if method == "plain":
        def plain():
            return plain_step_model(state, model, X, y, eps, lam, MNIST_N, info.alpha_t,
                                    info.beta_t)
        err = float(np.max(np.abs(plain()[0] - info.mu)) / np.max(np.abs(info.mu)))
        if not err <= 1e-10:  # the floor must be the same arithmetic
            raise ValueError(f"plain_step_model differs from slang.step: mu rel err {err:.2e}")
        return plain
    W_T = np.ascontiguousarray(info.W.T)
    theta = np.ascontiguousarray(info.theta[:, 0])
    R = np.linalg.eigh(W_T @ W_T.T)[1][:, ::-1][:, :L]
    parts = {"peg": lambda: model.per_example_grads(theta, X, y),
             "peg-out": lambda: model.per_example_grads(theta, X, y, out=W_T[L:]),
             "gram": lambda: W_T @ W_T.T,
             "eigh": lambda G=W_T @ W_T.T: np.linalg.eigh(G),
             "U_new": lambda: W_T.T @ R,
             "Delta_d": lambda: np.einsum("kd,kd->d", W_T, W_T),
             "sum": lambda: W_T[L:].sum(axis=0)}
    return parts[method]


class SLANGMnistStep:
    """SLANG (driven, L = 1, S = 1) on the MNIST MLP [784, 100, 10], M = 128, beside an Adam
    step, the plain-NumPy floor (``plain_step_model``) and the floor's parts (``mnist_case``)."""
    params = (["adam", "slang", "plain", "peg", "peg-out", "gram", "eigh", "U_new", "Delta_d",
               "sum"],)
    param_names = ["case"]

    def setup(self, case):
        self.run = mnist_case(case)

    def time_step(self, case):
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
        """The stopping quantity at the returned optimum (exact_vi.4); fit_full's tol is 1e-10."""
        return _exact_vi_fit(dataset).grad_norm

    track_grad_norm.unit = "grad norm"

    def track_n_iter(self, dataset):
        return _exact_vi_fit(dataset).n_iter

    track_n_iter.unit = "iterations"


@functools.lru_cache(maxsize=None)
def table_problem(dataset):
    """(model, X_train, y_train, lam, M) of restart 0 (seed 0) of ``refbayes reproduce
    slang-logreg``: its own split, priors and minibatch size. Reads REFBAYES_DATA;
    NotImplementedError (asv: skip) when the files are not there."""
    from refbayes.experiments import slang_logreg
    try:
        X, y = slang_logreg._load(dataset, None, 0, 0)[:2]
    except FileNotFoundError as err:
        first_line = str(err).splitlines()[0]
        raise NotImplementedError(f"{first_line}; set REFBAYES_DATA") from None
    prior, M, _ = slang_logreg.DATASETS[dataset]
    return LogisticRegression(X.shape[1]), X, y, slang_logreg._prior(X.shape[1] + 1, prior), M


class SLANGTableEpoch:
    """One driven epoch (``driver.run``, S = 12) of each method of the SLANG logistic-regression
    table, from the experiment's own starting state, on its data: where the table's CPU-hours
    go (derivations/slang-findings.md). australian: 345 rows, D = 15, M = 32; a1a: 1605 rows, D = 120,
    M = 128; usps-3vs5: D = 257, M = 64."""
    params = (["australian", "a1a", "usps-3vs5"],
              ["mf-ef", "mf-hess", "mf-exact", "slang-1", "slang-10", "full-ef", "full-hess",
               "full-exact"])
    param_names = ["dataset", "method"]

    def setup(self, dataset, method):
        from refbayes.experiments import slang_logreg
        self.model, self.X, self.y, lam, self.M = table_problem(dataset)
        self.state, self.cfg = slang_logreg._init(method, self.model.D, self.X.shape[0], lam)

    def time_epoch(self, dataset, method):
        from refbayes.experiments import slang_logreg
        from refbayes.methods import driver
        driver.run(self.state, self.cfg, self.model, self.X, self.y,
                   rng=np.random.default_rng(0), epochs=1, M=self.M, S=slang_logreg.SAMPLES)


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
          "BLAS threads: REFBAYES_BENCH_THREADS, default 1)")
    cases = ([("slang", D, L) for D in DS for L in LS]
             + [("full-ef", D, FullGaussianStep.L) for D in DS])
    for method, D, L in cases:
        cmd = [sys.executable, "-m", "benchmarks.bench_slang", method, str(D), str(L)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
