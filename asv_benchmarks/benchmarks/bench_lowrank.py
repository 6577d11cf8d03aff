"""Low-rank-plus-diagonal precision algebra against the dense computation it replaces.

``time_floor`` is the work no algorithm for P^{-1} g with P = U U^T + diag(d) can skip: an L x L
Gram product of U (O(D L^2); U^T U stands in for U^T d^{-1} U) and the two thin products U^T h,
U z (O(D L)). The goal for solve and sample is <= 2x of it for D >= 1e4; ``*_unchecked`` time
them inside ``refbayes.unchecked()`` (the drivers' path), the others with every value check of a
direct call.
"""
import functools

import numpy as np

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

def main(rounds=7):
    """The floor and the four timed routes at D = 1e4, 1e5, 1e6 (L = 10), interleaved in one
    process (``rounds`` rounds, median), with each route's ratio to the floor of the same D:
    the issue's <= 2x goal is read off this table."""
    cases = {}
    for D in (10_000, 100_000, 1_000_000):
        b = LowRank()
        b.setup("numpy", D, 10)
        for route in ("floor", "solve", "sample", "solve_unchecked", "sample_unchecked"):
            cases[D, route] = functools.partial(getattr(b, f"time_{route}"), "numpy", D, 10)
    times = interleaved_medians(cases, rounds, min_time=0.05)
    print(f"{'D':>9} {'route':<17} {'ms':>9} {'x floor':>8}   (L = 10, median of {rounds})")
    for (D, route), t in times.items():
        print(f"{D:>9} {route:<17} {1e3 * t:9.3f} {t / times[D, 'floor']:8.2f}")


if __name__ == "__main__":
    main()
