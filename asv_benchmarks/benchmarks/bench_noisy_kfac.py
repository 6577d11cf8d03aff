"""Noisy K-FAC (refbayes.methods.noisy_kfac) against an Adam step of the same net, and the
Kronecker-factored solves of refbayes.linalg.kron against a dense solve (issue 12, part 4).

- NoisyKFACStep: one ``noisy_kfac.step`` on MLP [50, 400, 400, 10] (tanh, categorical,
  D = 51*400 + 401*400 + 401*10 = 184810), M = 128, one draw per step (S = 1, eps (D, 1)),
  damping "factored" (official), curvature "ggn", "ef" or "mc" (the official estimator: the
  EF at labels sampled from the model, here fixed labels from seed 3: the cost is that of one
  more backward pass), T_inv in {1, 20}, T_stats in {1, 20} (T_stats > T_inv skipped); and
  ``adam.step`` (refbayes.methods.adam, the MAP / Adam step: one summed backprop pass) of the same
  net and batch as the reference. Issue target: <= 3x Adam per step at T_inv = 20.
- KFACStep: the same with eps = None (K-FAC: the gradient at the mean, curvature "ggn", the
  solve's operators only), T_inv in {1, 20}, T_stats in {1, 20} (issue 37, item 2).
  Inputs (fixed seeds): X (128, 50) standard normal, labels uniform in 0..9 (seed 0); mu from
  ``model.init_theta`` (seed 0); factors from three warm-up steps at beta = 1 (so A, S, A_ref,
  S_ref are the statistics of a real batch at a draw, not the identity of ``init``), then t reset
  to 10 T_inv (a multiple of T_inv and of T_stats), and ``noisy_kfac.refresh`` so that the state
  holds the operators of its A_ref, S_ref (noisy_kfac.12), as a state from ``step`` does;
  N = 50000, eta = 1, lambda = 1 (gamma_in = 2e-5), gamma_ex = 0; eps for the T_inv steps from
  seed 1. Adam: lam = 1 / eta, default config.
  Timing: ``time_noisy_kfac_cycle`` runs T_inv CONSECUTIVE steps (state chained), so the cycle
  holds exactly one refresh A_ref, S_ref <- A, S with its decompositions (at its last step),
  and T_inv / T_stats factor statistics: the asv figure is per
  CYCLE; divide by T_inv for the time per step. ``time_adam_cycle`` runs T_inv Adam steps the
  same way, so the two asv figures are directly comparable. ``track_ratio`` times both cycles
  interleaved in one process with timeit (median of repeats) and returns the per-step ratio
  Noisy K-FAC / Adam.
- KronSolve: ``kron.solve`` (exact damping, eigh of both factors), ``kron.solve_factored``
  (factored damping, Cholesky of both damped factors) and "cached" (``kron.solve_chol`` with the
  damped factors' Cholesky factors computed once in setup: the solve of a Noisy K-FAC step
  between refreshes) of one right-hand side X (n_in, n_out),
  D = n_in n_out in {900, 1e4, 3e4, 1e5} for square layers (n = 30, 100, 173, 316) and the
  rectangular D = 1e5 layers 1000 x 100 and 100 x 1000. Factors A = G G^T / n + 0.5 I (G standard
  normal, seed 0; condition ~ 10), gamma = 1e-3. ``track_rel_residual_rel_err`` is
  max|(A kron S + gamma I) z - x| / max|x| (exact) or the same with the damped factors
  (factored), through ``kron.kron_matvec``: available at every D.
- DenseSolve: ``numpy.linalg.solve`` (``cupy.linalg.solve``) of the same systems on the formed
  D x D matrix (kron(A, S) + gamma I, or kron(A_g, S_g) for factored damping), forming not timed;
  ``track_rel_err`` is max|z_kron - z_dense| / max|z_dense| (~1e-15), ``track_ratio`` the dense
  time over the Kronecker time. Dense only for D <= DENSE_MAX_D: NumPy 1e4 (the matrix is 0.8 GB
  and the solve copies it: 1.6 GB; LU of 2/3 D^3 = 6.7e11 flop takes ~16 s on one core of the dev
  machine (a 4000-square solve takes 1.05 s); D = 3e4 would need 14.4 GB and ~7 min), CuPy 3e4
  (14.4 GB fits a 78 GiB H100; D = 1e5 needs 160 GB).

One-core figures:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        asv run --python=same -b bench_noisy_kfac

``python -m benchmarks.bench_noisy_kfac`` (from asv_benchmarks/) prints the per-step times and
ratios, the Kronecker vs dense solve times, and the log-log scaling exponents of the Kronecker
solves in n (square), n_in (n_out = 100) and n_out (n_in = 100), in one process;
``python -m benchmarks.bench_noisy_kfac profile`` adds a cProfile of one T_inv = 20 cycle.
"""
import functools
import math

import numpy as np

from refbayes.backend import xp_of
from refbayes.linalg import kron
from refbayes.methods import adam
from refbayes.methods import noisy_kfac as nk
from refbayes.methods._estimates import Batch
from refbayes.models import MLP

from .common import BACKENDS, backend, sync

WIDTHS = [25, 400]  # the net is [50, 400, 400, 10]; 25 keeps the once-run test short
WIDTH = 400
M = 128
N = 50_000
ETA = 1.0            # prior variance; Adam's prior precision is 1 / ETA
T_INVS = [1, 20]
T_STATS = [1, 20]
CURVATURES = ["ggn", "ef", "mc"]
N_WARMUP = 3

SHAPES = ["30x30", "100x100", "173x173", "316x316", "1000x100", "100x1000"]
GAMMA = 1e-3
KINDS = ["exact", "factored", "cached"]
DENSE_MAX_D = {"numpy": 10_000, "cupy": 30_000}  # reasons in the module docstring


def sizes(width=WIDTH):
    return [50, width, width, 10]


def model(width=WIDTH):
    return MLP(sizes(width), "tanh", "categorical")


@functools.lru_cache(maxsize=None)
def _batch_host(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, sizes()[0])), rng.integers(0, sizes()[-1], M)


@functools.lru_cache(maxsize=None)
def _mu_host(width=WIDTH):
    return model(width).init_theta(np.random.default_rng(0))


def config(T_inv, curvature, T_stats=1, **kw):
    return nk.NoisyKFACConfig(N=N, eta=ETA, T_inv=T_inv, T_stats=T_stats, curvature=curvature,
                              **kw)


@functools.lru_cache(maxsize=None)
def _y_tilde_host(seed=3):
    """Fixed labels standing in for the sampled ones of curvature "mc" (S = 1, M)."""
    return np.random.default_rng(seed).integers(0, sizes()[-1], (1, M))


@functools.lru_cache(maxsize=None)
def _warm_state_host(curvature, width=WIDTH):
    """The state after N_WARMUP steps at beta = 1 (factors = the last batch statistics)."""
    net = model(width)
    X, y = _batch_host()
    state = nk.init(_mu_host(width), net)
    cfg = config(1, curvature, beta=1.0)
    rng = np.random.default_rng(2)
    y_tilde = _y_tilde_host() if curvature == "mc" else None
    for _ in range(N_WARMUP):
        state, _ = nk.step(state, Batch(X, y), rng.standard_normal((net.D, 1)), cfg, net,
                           y_tilde=y_tilde)
    return state


def warm_state(xp, curvature, t, width=WIDTH):
    s = _warm_state_host(curvature, width)
    conv = lambda fs: tuple(xp.asarray(F) for F in fs)  # noqa: E731
    return nk.NoisyKFACState(xp.asarray(s.mu), xp.asarray(s.m), conv(s.A), conv(s.S),
                             conv(s.A_ref), conv(s.S_ref), t)


@functools.lru_cache(maxsize=None)
def _eps_host(T_inv, D, seed=1):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((D, 1)) for _ in range(T_inv))


class NoisyKFACStep:
    """T_inv consecutive Noisy K-FAC steps (one refresh) vs T_inv Adam steps; per CYCLE."""
    params = (BACKENDS, WIDTHS, T_INVS, T_STATS, CURVATURES)
    param_names = ["backend", "width", "T_inv", "T_stats", "curvature"]
    number = 1
    repeat = (3, 10, 60.0)
    warmup_time = 0.0
    timeout = 300.0

    def setup(self, name, width, T_inv, T_stats, curvature):
        if T_stats > T_inv:
            raise NotImplementedError(f"T_stats = {T_stats} > T_inv = {T_inv}: refreshes of "
                                      "unchanged factors")
        self.xp = xp = backend(name)
        self.net = model(width)
        X, y = _batch_host()
        self.batch = Batch(xp.asarray(X), xp.asarray(y))
        self.y_tilde = xp.asarray(_y_tilde_host()) if curvature == "mc" else None
        self.cfg = config(T_inv, curvature, T_stats)
        self.state = nk.refresh(warm_state(xp, curvature, 10 * T_inv, width), self.cfg,
                                self.net)
        self.eps = [xp.asarray(e) for e in _eps_host(T_inv, self.net.D)]
        self.adam_state = adam.init(xp.asarray(_mu_host(width)))
        self.adam_cfg = adam.AdamConfig()
        self.noisy_kfac_cycle()  # warm-up (CuPy kernels, BLAS buffers)
        self.adam_cycle()

    def noisy_kfac_cycle(self):
        state = self.state
        for e in self.eps:
            state, _ = nk.step(state, self.batch, e, self.cfg, self.net, y_tilde=self.y_tilde)
        sync(self.xp)
        return state

    def adam_cycle(self):
        state = self.adam_state
        for _ in self.eps:
            state, _ = adam.step(state, self.batch, self.adam_cfg, self.net, N, 1.0 / ETA)
        sync(self.xp)
        return state

    def time_noisy_kfac_cycle(self, name, width, T_inv, T_stats, curvature):
        self.noisy_kfac_cycle()

    def time_adam_cycle(self, name, width, T_inv, T_stats, curvature):
        self.adam_cycle()

    def per_step_ms(self, repeat=5):
        """(Noisy K-FAC, Adam) ms per step, one entry per timed cycle, interleaved."""
        import timeit
        T = len(self.eps)
        t_nk, t_adam = [], []
        for _ in range(repeat):
            t_nk.append(1e3 * timeit.timeit(self.noisy_kfac_cycle, number=1) / T)
            t_adam.append(1e3 * timeit.timeit(self.adam_cycle, number=1) / T)
        return np.array(t_nk), np.array(t_adam)

    def track_ratio(self, name, width, T_inv, T_stats, curvature):
        """Median Noisy K-FAC step / median Adam step, interleaved cycles."""
        t_nk, t_adam = self.per_step_ms(repeat=3)
        return float(np.median(t_nk) / np.median(t_adam))

    track_ratio.unit = "x Adam step"


class KFACStep(NoisyKFACStep):
    """K-FAC (``noisy_kfac.step`` with eps = None: the gradient at the mean, no draw, the
    solve's operators only), curvature "ggn", T_inv consecutive steps vs T_inv Adam steps
    (issue 37, item 2); same net, batch, warm factors and timing as NoisyKFACStep."""
    params = (BACKENDS, WIDTHS, T_INVS, T_STATS)
    param_names = ["backend", "width", "T_inv", "T_stats"]

    def setup(self, name, width, T_inv, T_stats):
        super().setup(name, width, T_inv, T_stats, "ggn")
        self.state = nk.refresh(self.state, self.cfg, self.net, sampler=False)
        self.eps = [None] * T_inv
        self.noisy_kfac_cycle()

    def time_noisy_kfac_cycle(self, name, width, T_inv, T_stats):
        self.noisy_kfac_cycle()

    def time_adam_cycle(self, name, width, T_inv, T_stats):
        self.adam_cycle()

    def track_ratio(self, name, width, T_inv, T_stats):
        """Median K-FAC step / median Adam step, interleaved cycles."""
        t_nk, t_adam = self.per_step_ms(repeat=3)
        return float(np.median(t_nk) / np.median(t_adam))

    track_ratio.unit = "x Adam step"


# ----------------------------------------------------------------------------- Kronecker solves

def parse_shape(shape):
    n_in, n_out = (int(s) for s in shape.split("x"))
    return n_in, n_out


@functools.lru_cache(maxsize=None)
def _kron_host(n_in, n_out, seed=0):
    rng = np.random.default_rng(seed)
    G = rng.standard_normal((n_in, n_in))
    H = rng.standard_normal((n_out, n_out))
    A = G @ G.T / n_in + 0.5 * np.eye(n_in)
    S = H @ H.T / n_out + 0.5 * np.eye(n_out)
    return (A + A.T) / 2, (S + S.T) / 2, rng.standard_normal((n_in, n_out))


def kron_inputs(xp, n_in, n_out):
    return tuple(xp.asarray(a) for a in _kron_host(n_in, n_out))


def damped_factors(A, S, gamma):
    """(A_g, S_g) of the factored damping: A + pi sqrt(gamma) I, S + sqrt(gamma) / pi I."""
    xp = xp_of(A, S)
    pi = float(kron.factored_damping_pi(A, S))
    root = math.sqrt(gamma)
    return (A + pi * root * xp.eye(A.shape[0], dtype=A.dtype),
            S + root / pi * xp.eye(S.shape[0], dtype=S.dtype))


def kron_solver(kind, A, S):
    """X -> the damped Kronecker solve: "exact" and "factored" factor A and S in every call (as
    a refresh does), "cached" factors the damped factors here once and solves with their
    Cholesky factors (a Noisy K-FAC step between refreshes, (noisy_kfac.12))."""
    if kind == "exact":
        return lambda X: kron.solve(A, S, X, damping=GAMMA)
    if kind == "factored":
        return lambda X: kron.solve_factored(A, S, X, GAMMA)
    xp = xp_of(A, S)
    L_A, L_S = (xp.linalg.cholesky(F) for F in damped_factors(A, S, GAMMA))
    return lambda X: kron.solve_chol(L_A, L_S, X)


class KronSolve:
    """kron.solve (exact damping) / kron.solve_factored / kron.solve_chol with cached factors
    of one (n_in, n_out) right-hand side."""
    params = (BACKENDS, SHAPES, KINDS)
    param_names = ["backend", "shape", "kind"]
    timeout = 120.0

    def setup(self, name, shape, kind):
        self.xp = backend(name)
        self.kind = kind
        self.A, self.S, self.X = kron_inputs(self.xp, *parse_shape(shape))
        self.solver = kron_solver(kind, self.A, self.S)
        self.run()

    def run(self):
        out = self.solver(self.X)
        sync(self.xp)
        return out

    def time_solve(self, name, shape, kind):
        self.run()

    def track_rel_residual_rel_err(self, name, shape, kind):
        """max|K z - x| / max|x| with K the damped Kronecker matrix, never formed."""
        Z = self.run()
        if self.kind == "exact":
            R = kron.kron_matvec(self.A, self.S, Z) + GAMMA * Z
        else:
            R = kron.kron_matvec(*damped_factors(self.A, self.S, GAMMA), Z)
        return float(self.xp.max(self.xp.abs(R - self.X)) / self.xp.max(self.xp.abs(self.X)))

    track_rel_residual_rel_err.unit = "relative residual"


_DENSE_CACHE = {}


class DenseSolve:
    """numpy.linalg.solve on the formed D x D damped Kronecker matrix, D <= DENSE_MAX_D."""
    params = (BACKENDS, SHAPES, KINDS)
    param_names = ["backend", "shape", "kind"]
    number = 1
    repeat = (1, 3, 120.0)
    warmup_time = 0.0
    timeout = 600.0

    def setup(self, name, shape, kind):
        self.xp = xp = backend(name)
        n_in, n_out = parse_shape(shape)
        D = n_in * n_out
        if D > DENSE_MAX_D[name]:
            raise NotImplementedError(f"dense D = {D} > DENSE_MAX_D = {DENSE_MAX_D[name]} "
                                      f"({8 * D * D / 1e9:.1f} GB per copy)")
        self.key = (name, shape, kind)
        self.kind = kind
        self.A, self.S, self.X = kron_inputs(xp, n_in, n_out)
        if kind == "exact":
            self.K = kron.dense(self.A, self.S)
            idx = xp.arange(D)
            self.K[idx, idx] += GAMMA
        else:
            self.K = kron.dense(*damped_factors(self.A, self.S, GAMMA))
        self.x = self.X.reshape(-1)
        self.structured = KronSolve()
        self.structured.setup(name, shape, kind)

    def run(self):
        out = self.xp.linalg.solve(self.K, self.x)
        sync(self.xp)
        return out

    def _dense_once(self):
        """(z_dense, seconds) for this case, one solve per process (shared by the tracks)."""
        if self.key not in _DENSE_CACHE:
            import time
            t0 = time.perf_counter()
            z = self.run()
            _DENSE_CACHE[self.key] = (z, time.perf_counter() - t0)
        return _DENSE_CACHE[self.key]

    def time_dense(self, name, shape, kind):
        self.run()

    def track_rel_err(self, name, shape, kind):
        """max|z_kron - z_dense| / max|z_dense|."""
        z, _ = self._dense_once()
        got = self.structured.run().reshape(-1)
        return float(self.xp.max(self.xp.abs(got - z)) / self.xp.max(self.xp.abs(z)))

    track_rel_err.unit = "relative difference"

    def track_ratio(self, name, shape, kind):
        """Dense solve time / Kronecker solve time (one dense solve, median of 5 Kronecker)."""
        import timeit
        _, t_dense = self._dense_once()
        t_kron = float(np.median(timeit.repeat(self.structured.run, number=1, repeat=5)))
        return t_dense / t_kron

    track_ratio.unit = "dense / Kronecker"


# ----------------------------------------------------------------------------- without asv

def _median_s(fn, repeat=7, min_time=0.05):
    """Median seconds per call over `repeat` timings of `number` calls (number from the first)."""
    import timeit
    first = timeit.timeit(fn, number=1)
    number = max(1, int(min_time / max(first, 1e-9)))
    return float(np.median(timeit.repeat(fn, number=number, repeat=repeat))) / number


def _slope(ns, ts):
    return float(np.polyfit(np.log(ns), np.log(ts), 1)[0])


def _solve_time(kind, n_in, n_out):
    A, S, X = kron_inputs(np, n_in, n_out)
    solver = kron_solver(kind, A, S)
    return _median_s(lambda: solver(X), repeat=3)


def profile_cycle(T_inv=20, curvature="ggn", T_stats=1, top=25):
    """cProfile of one Noisy K-FAC cycle of T_inv steps (numpy), sorted by total time."""
    import cProfile
    import pstats
    b = NoisyKFACStep()
    b.setup("numpy", WIDTH, T_inv, T_stats, curvature)
    prof = cProfile.Profile()
    prof.enable()
    b.noisy_kfac_cycle()
    prof.disable()
    stats = pstats.Stats(prof).strip_dirs().sort_stats("tottime")
    stats.print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main(profile=False):
    """Per-step times and ratios, dense vs Kronecker solves, scaling exponents (one process)."""
    print("Noisy K-FAC on MLP [50, 400, 400, 10], M = 128, S = 1, factored damping")
    print(f"{'case':<28} {'noisy-kfac ms/step':>19} {'adam ms/step':>13} {'ratio':>6}   "
          f"{'min nk':>7} {'min adam':>8} {'ratio':>6}   (interleaved cycles: median | min)")
    for curvature in CURVATURES:
        for T_inv in T_INVS:
            for T_stats in (t for t in T_STATS if t <= T_inv):
                b = NoisyKFACStep()
                b.setup("numpy", WIDTH, T_inv, T_stats, curvature)
                t_nk, t_adam = b.per_step_ms(repeat=9 if T_inv > 1 else 61)
                med_nk, med_adam = np.median(t_nk), np.median(t_adam)
                min_nk, min_adam = np.min(t_nk), np.min(t_adam)
                case = f"{curvature} T_inv={T_inv} T_stats={T_stats}"
                print(f"{case:<28} {med_nk:19.2f} {med_adam:13.2f} {med_nk / med_adam:6.2f}   "
                      f"{min_nk:7.2f} {min_adam:8.2f} {min_nk / min_adam:6.2f}", flush=True)
    for T_inv in T_INVS:
        for T_stats in (t for t in T_STATS if t <= T_inv):
            b = KFACStep()
            b.setup("numpy", WIDTH, T_inv, T_stats)
            t_nk, t_adam = b.per_step_ms(repeat=9 if T_inv > 1 else 61)
            med_nk, med_adam = np.median(t_nk), np.median(t_adam)
            min_nk, min_adam = np.min(t_nk), np.min(t_adam)
            case = f"kfac ggn T_inv={T_inv} T_stats={T_stats}"
            print(f"{case:<28} {med_nk:19.2f} {med_adam:13.2f} {med_nk / med_adam:6.2f}   "
                  f"{min_nk:7.2f} {min_adam:8.2f} {min_nk / min_adam:6.2f}", flush=True)

    print("\nKronecker solve vs dense numpy.linalg.solve (dense only for D <= "
          f"{DENSE_MAX_D['numpy']})")
    print(f"{'shape':<10} {'D':>7} {'kind':<9} {'kron ms':>9} {'dense s':>9} {'ratio':>9} "
          f"{'rel err':>9} {'resid':>9}")
    for shape in SHAPES:
        for kind in KINDS:
            k = KronSolve()
            k.setup("numpy", shape, kind)
            t_k = _median_s(k.run)
            res = k.track_rel_residual_rel_err("numpy", shape, kind)
            n_in, n_out = parse_shape(shape)
            D = n_in * n_out
            line = f"{shape:<10} {D:>7} {kind:<9} {1e3 * t_k:9.3f} "
            if D <= DENSE_MAX_D["numpy"]:
                d = DenseSolve()
                d.setup("numpy", shape, kind)
                err = d.track_rel_err("numpy", shape, kind)
                t_d = _DENSE_CACHE[d.key][1]
                line += f"{t_d:9.3f} {t_d / t_k:9.0f} {err:9.1e} "
                del d
                _DENSE_CACHE.clear()
            else:
                line += f"{'-':>9} {'-':>9} {'-':>9} "
            print(line + f"{res:9.1e}", flush=True)

    print("\nScaling exponents of the Kronecker solves (log-log slope of time)")
    sweeps = {"square n (n_in = n_out = n)": [(n, n) for n in (100, 173, 316, 562, 1000)],
              "n_in (n_out = 100)": [(n, 100) for n in (100, 316, 1000, 3162)],
              "n_out (n_in = 100)": [(100, n) for n in (100, 316, 1000, 3162)]}
    for label, shapes in sweeps.items():
        for kind in KINDS:
            ts = [_solve_time(kind, *s) for s in shapes]
            ns = [s[0] if label.startswith("n_in") else s[1] for s in shapes]
            pts = " ".join(f"{n}:{1e3 * t:.2f}ms" for n, t in zip(ns, ts))
            print(f"{label:<28} {kind:<9} slope {_slope(ns, ts):5.2f} "
                  f"(last two {_slope(ns[-2:], ts[-2:]):5.2f})  {pts}", flush=True)
    if profile:
        print("\ncProfile of one ggn T_inv = 20 cycle (20 steps)")
        profile_cycle()


if __name__ == "__main__":
    import sys
    main(profile="profile" in sys.argv[1:])
