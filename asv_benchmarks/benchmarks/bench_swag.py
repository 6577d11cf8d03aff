"""SWAG (refbayes.methods.swag): collecting a snapshot and drawing samples, against the memory
traffic each must do.

Inputs: snapshots theta_i = theta_0 + 0.01 N(0, I) (fixed seeds), K = 20 already collected, so the
ring buffer is full and every collect overwrites a row (the steady state of a run).

- Collect: ``swag.collect`` at D parameters, ``inplace`` True (write the new deviation into the
  state's buffer) or False (the pure form: a copy of the (K, D) buffer per call).
  Floor: the update reads theta, theta_bar, theta2_bar and writes theta_bar, theta2_bar and one
  buffer row: 6 D floats (48 MB at D = 1e6 in float64). ``time_floor`` times a copy of 3 D
  floats (3 D read + 3 D written) on the same machine: the time the traffic alone takes.
  The copy form adds 2 K D floats (read and write the buffer): 40 D more.
- Sample: ``swag.sample`` with S draws: SWAG (diagonal + low rank) and SWAG-Diagonal.
  Floor: read D_hat (K D, SWAG only), theta_bar, theta2_bar, z1 (S D) and write the draws (S D):
  (K + S + 2) D + S D floats (6.6e8 bytes at D = 1e6, K = 20, S = 30). ``time_floor`` copies S D floats and sums (K + 2) D more (the reads that
  have no write). The arithmetic is one (D, K) x (K, S) product (2 D K S flops, 1.2 GFLOP at the
  sizes above) and O(D S) elementwise work. On NumPy ``sample`` runs over row panels (the product
  into a cached buffer, then one fused elementwise pass); the before / after table and the panel
  size's measurement are in derivations/swag_experiments.md, "sample".

asv times whatever BLAS threading the process starts with; for one-core figures:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 asv run --python=same -b bench_swag

``python -m benchmarks.bench_swag`` (from asv_benchmarks/) prints the median times in one process.
"""
import functools

import numpy as np

from refbayes.methods import swag

from .common import BACKENDS, backend, sync

K = 20
S = 30
DS = [10_000, 100_000, 1_000_000]


@functools.lru_cache(maxsize=None)
def _snapshots(D, n, seed=0):
    rng = np.random.default_rng(seed)
    theta0 = rng.standard_normal(D)
    return theta0 + 0.01 * rng.standard_normal((n, D))


def collected(xp, D):
    """A SWAGState with K + 1 snapshots (full ring), and the next snapshot."""
    thetas = _snapshots(D, K + 2)
    cfg = swag.SWAGConfig(K=K)
    state = swag.init(xp.asarray(thetas[0]), cfg)
    for th in thetas[:-1]:
        state, _ = swag.collect(state, xp.asarray(th), cfg, inplace=True)
    return state, xp.asarray(thetas[-1]), cfg


class Collect:
    params = (BACKENDS, DS, [True, False])
    param_names = ["backend", "D", "inplace"]
    timeout = 300

    def setup(self, name, D, inplace):
        self.xp = backend(name)
        self.state, self.theta, self.cfg = collected(self.xp, D)
        # ones, not zeros: untouched zero pages read as the shared zero page and flatter the floor
        self.src = self.xp.ones((3, D))
        self.dst = self.xp.ones((3, D))

    def run(self, inplace):
        out = swag.collect(self.state, self.theta, self.cfg, inplace=inplace)
        sync(self.xp)
        return out

    def time_collect(self, name, D, inplace):
        self.run(inplace)

    def time_floor(self, name, D, inplace):
        self.xp.copyto(self.dst, self.src)
        sync(self.xp)


class Sample:
    params = (BACKENDS, DS, ["swag", "diag"])
    param_names = ["backend", "D", "kind"]
    timeout = 300

    def setup(self, name, D, kind):
        self.xp = xp = backend(name)
        self.state, _, cfg = collected(xp, D)
        rng = np.random.default_rng(1)
        self.z1 = xp.asarray(rng.standard_normal((D, S)))
        self.z2 = xp.asarray(rng.standard_normal((K, S))) if kind == "swag" else None
        self.cfg = cfg if kind == "swag" else cfg._replace(scale=1.0)
        self.copy_src = xp.ones((D, S))
        self.copy_dst = xp.ones((D, S))
        self.read_only = xp.ones(((K if kind == "swag" else 0) + 2) * D)

    def run(self):
        out = swag.sample(self.state, self.z1, self.z2, self.cfg)
        sync(self.xp)
        return out

    def time_sample(self, name, D, kind):
        self.run()

    def time_floor(self, name, D, kind):
        self.xp.copyto(self.copy_dst, self.copy_src)
        float(self.read_only.sum())
        sync(self.xp)


def _median_ms(fn, repeat=7):
    import timeit
    return 1e3 * float(np.median(timeit.repeat(fn, number=1, repeat=repeat)))


def main():
    for D in DS:
        for inplace in (True, False):
            b = Collect()
            b.setup("numpy", D, inplace)
            t = _median_ms(lambda: b.run(inplace))
            f = _median_ms(lambda: b.time_floor("numpy", D, inplace))
            print(f"collect D={D:<8} inplace={inplace!s:<5} {t:10.3f} ms   floor {f:8.3f} ms",
                  flush=True)
    for D in DS:
        for kind in ("swag", "diag"):
            b = Sample()
            b.setup("numpy", D, kind)
            t = _median_ms(b.run)
            f = _median_ms(lambda: b.time_floor("numpy", D, kind))
            print(f"sample  D={D:<8} {kind:<13} {t:10.3f} ms   floor {f:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
