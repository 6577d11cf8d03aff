"""Low-rank-plus-diagonal precision algebra against the dense computation it replaces.

``time_floor`` is the work no algorithm for P^{-1} g with P = U U^T + diag(d) can skip: an L x L
Gram product of U (O(D L^2); U^T U stands in for U^T d^{-1} U) and the two thin products U^T h,
U z (O(D L)). The goal for solve and sample is <= 2x of it for D >= 1e4; ``*_unchecked`` time
them inside ``refbayes.unchecked()`` (the drivers' path), the others with every value check of a
direct call.

``LowRankPlain`` times the same algorithms written in plain NumPy (``plain_solve``,
``plain_sample``: no checks, the Gram matrix U^T (U / d) in one piece) and row-blocked
(``*_blocked``: the Gram matrix summed over blocks of 8192 rows scaled by NumPy's broadcast, no
numba), at D = 1e4, 1e5, 1e6 and L = 10: the issue-37 goal is ``*_unchecked`` at most 1.2x the
faster of the two at every D (derivations/lowrank_experiments.md, "solve and sample against plain
NumPy").
"""
import functools
import os

import numpy as np
import scipy.linalg

import refbayes
from refbayes.linalg import lowrank

from .common import BACKENDS, DENSE_MAX_D, backend, interleaved_medians, lowrank_inputs, sync

DS = [100, 1000, 10000]
LS = [1, 10, 32]


class LowRank:
    params = (BACKENDS, DS, LS)
    param_names = ["backend", "D", "L"]

    def setup(self, name, D, L):
        self.xp = backend(name)
        self.U, self.d, self.g = lowrank_inputs(self.xp, D, L)
        self.eps = self.g
        # SLANG's fast_eig factor [sqrt(1-beta) U, sqrt(beta) G^T] with a minibatch of M = 32
        G_T = lowrank_inputs(self.xp, D, 32, seed=1)[0]
        self.W = self.xp.concatenate([self.U, G_T], axis=1)
        self.Omega = lowrank_inputs(self.xp, self.W.shape[1], L + 5, seed=2)[0]
        lowrank.solve(self.U, self.d, self.g)  # warm-up: allocations, CuPy kernel compilation
        sync(self.xp)

    def time_floor(self, name, D, L):
        self.U.T @ self.U
        self.U @ (self.U.T @ self.g)
        sync(self.xp)

    def time_solve(self, name, D, L):
        lowrank.solve(self.U, self.d, self.g)
        sync(self.xp)

    def time_sample(self, name, D, L):
        lowrank.sample(self.g, self.U, self.d, self.eps)
        sync(self.xp)

    def time_solve_unchecked(self, name, D, L):
        with refbayes.unchecked():
            lowrank.solve(self.U, self.d, self.g)
        sync(self.xp)

    def time_sample_unchecked(self, name, D, L):
        with refbayes.unchecked():
            lowrank.sample(self.g, self.U, self.d, self.eps)
        sync(self.xp)

    def time_top_eig_exact(self, name, D, L):
        lowrank.top_eig(self.W, L)
        sync(self.xp)

    def time_top_eig_randomized(self, name, D, L):
        lowrank.top_eig(self.W, L, method="randomized", Omega=self.Omega, n_iter=2)
        sync(self.xp)

    def time_logdet(self, name, D, L):
        lowrank.logdet(self.U, self.d)
        sync(self.xp)

    def peakmem_solve(self, name, D, L):
        lowrank.solve(self.U, self.d, self.g)


class LowRankLarge(LowRank):
    """The same timings at D = 1e5, 1e6 (L = 10), where the D x L temporaries of a plain
    implementation no longer fit in cache: the regime of the row-blocked Gram sum."""
    params = (BACKENDS, [100_000, 1_000_000], [10])


PLAIN_ROWS = 8192  # the block of the row-blocked plain Gram sum: lowrank's own block size


def _gram(U, d, rows=None):
    """U^T diag(d)^{-1} U in one piece (rows None), or summed over blocks of ``rows`` rows."""
    if rows is None:
        return U.T @ (U / d[:, None])
    D, L = U.shape
    w = 1 / np.sqrt(d)
    G = np.zeros((L, L))
    buf = np.empty((min(rows, D), L))
    for a in range(0, D, rows):
        U_b = U[a:a + rows]
        V_b = buf[:U_b.shape[0]]
        np.multiply(U_b, w[a:a + rows, None], out=V_b)
        G += V_b.T @ V_b
    return G


def plain_solve(U, d, g, rows=None):
    """(lowrank.3) in plain NumPy: Cholesky of the capacitance, two thin products with U."""
    R = np.linalg.cholesky(np.eye(U.shape[1]) + _gram(U, d, rows))
    h = g / d
    z = scipy.linalg.cho_solve((R, True), U.T @ h)
    return h - (U @ z) / d


def plain_sample(mu, U, d, eps, rows=None):
    """(lowrank.8) in plain NumPy for a vector eps: eigh of the Gram matrix, f of it."""
    s = np.sqrt(d)
    lam, Q = np.linalg.eigh(_gram(U, d, rows))
    t = np.sqrt(1 + np.maximum(lam, 0))
    F = (Q * (1 / (t * (1 + t)))) @ Q.T
    return mu + (eps - (U @ (F @ (U.T @ (eps / s)))) / s) / s


class LowRankPlain:
    """The plain-NumPy twins of solve and sample (NumPy only), in one piece and row-blocked."""
    params = ([10_000, 100_000, 1_000_000], [10])
    param_names = ["D", "L"]

    def setup(self, D, L):
        self.U, self.d, self.g = lowrank_inputs(np, D, L)
        for rows in (None, PLAIN_ROWS):  # the twins compute what lowrank computes
            for mine, theirs in ((plain_solve(self.U, self.d, self.g, rows),
                                  lowrank.solve(self.U, self.d, self.g)),
                                 (plain_sample(self.g, self.U, self.d, self.g, rows),
                                  lowrank.sample(self.g, self.U, self.d, self.g))):
                err = float(np.max(np.abs(mine - theirs)) / np.max(np.abs(theirs)))
                if not err <= 1e-10:
                    raise ValueError(f"plain twin differs from lowrank: rel err {err:.2e}")

    def time_plain_solve(self, D, L):
        plain_solve(self.U, self.d, self.g)

    def time_plain_solve_blocked(self, D, L):
        plain_solve(self.U, self.d, self.g, PLAIN_ROWS)

    def time_plain_sample(self, D, L):
        plain_sample(self.g, self.U, self.d, self.g)

    def time_plain_sample_blocked(self, D, L):
        plain_sample(self.g, self.U, self.d, self.g, PLAIN_ROWS)


class DenseReference:
    """The same operations on the explicit D x D precision (skipped above DENSE_MAX_D)."""
    params = (["numpy"], DS, LS)
    param_names = ["backend", "D", "L"]

    def setup(self, name, D, L):
        if D > DENSE_MAX_D:
            raise NotImplementedError("dense D x D reference too large")
        import scipy.linalg
        self.sla = scipy.linalg
        U, d, self.g = lowrank_inputs(np, D, L)
        self.P = U @ U.T + np.diag(d)

    def time_dense_solve(self, name, D, L):
        self.sla.cho_solve(self.sla.cho_factor(self.P), self.g)

    def time_dense_sample(self, name, D, L):
        # S with S S^T = P^{-1}: the inverse transpose of P's Cholesky factor applied to eps
        self.sla.solve_triangular(self.sla.cholesky(self.P, lower=True), self.g, lower=True, trans="T")


class Accuracy:
    """Relative error of the structured routines against the dense ones, D = 1000."""
    params = ([1, 10, 32],)
    param_names = ["L"]

    def setup(self, L):
        self.U, self.d, self.g = lowrank_inputs(np, 1000, L)
        self.P = self.U @ self.U.T + np.diag(self.d)

    def track_solve_rel_err(self, L):
        ref = np.linalg.solve(self.P, self.g)
        return float(np.max(np.abs(lowrank.solve(self.U, self.d, self.g) - ref)) / np.max(np.abs(ref)))

    def track_logdet_rel_err(self, L):
        ref = np.linalg.slogdet(self.P)[1]
        return float(abs(lowrank.logdet(self.U, self.d) - ref) / abs(ref))


# ----------------------------------------------------------------------------- without asv

def main(rounds=9):
    """The floor, the four timed routes and the plain-NumPy twins at D = 1e4, 1e5, 1e6
    (L = 10), interleaved in one process (``rounds`` rounds, median), with each route's ratio to
    the floor of the same D (the <= 2x goal) and to the faster plain twin of its operation (the
    <= 1.2x goal of issue 37)."""
    cases = {}
    for D in (10_000, 100_000, 1_000_000):
        b = LowRank()
        b.setup("numpy", D, 10)
        for route in ("floor", "solve", "sample", "solve_unchecked", "sample_unchecked"):
            cases[D, route] = functools.partial(getattr(b, f"time_{route}"), "numpy", D, 10)
        p = LowRankPlain()
        p.setup(D, 10)
        for route in ("plain_solve", "plain_solve_blocked", "plain_sample",
                      "plain_sample_blocked"):
            cases[D, route] = functools.partial(getattr(p, f"time_{route}"), D, 10)
    print(f"load average before: {os.getloadavg()}")
    times = interleaved_medians(cases, rounds, min_time=0.05)
    print(f"{'D':>9} {'route':<21} {'ms':>9} {'x floor':>8} {'x plain':>8}   "
          f"(L = 10, median of {rounds})")
    for (D, route), t in times.items():
        op = "solve" if "solve" in route else "sample"
        plain = min(times[D, f"plain_{op}"], times[D, f"plain_{op}_blocked"])
        rel = "" if route == "floor" else f"{t / plain:8.2f}"
        print(f"{D:>9} {route:<21} {1e3 * t:9.3f} {t / times[D, 'floor']:8.2f} {rel}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
