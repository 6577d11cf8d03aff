"""K-FAC's relative Frobenius error per layer: ``FlatModel.kfac_block_errors`` ((peg.16), from
M x M Gram matrices) against the dense route (form each layer's exact block and
kron(A_l, B_l), then the Frobenius norms).

The issue's network: MLP [50, 100, 100, 10] (tanh, categorical, D = 16210), M = 128; the dense
route forms the 5100-, 10100- and 1010-square layer blocks (the middle one is 0.8 GB in float64)
from the factor rows C_i^T J_i ("ggn", M K = 1280 rows) or the per-example gradients ("ef").
Width 20 is the small case tests/test_benchmarks.py runs.

One-core figures:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        asv run --python=same -b bench_kfac_error

``python -m benchmarks.bench_kfac_error`` (from asv_benchmarks/) prints the median times and
their ratio with timeit, in one process.
"""
import functools

import numpy as np

from refbayes.backend import xp_of
from refbayes.models import MLP

from .common import BACKENDS, backend, sync

M = 128
WIDTHS = [20, 100]  # hidden width w of MLP [50, w, w, 10]; 100 is the network


def model(width):
    return MLP([50, width, width, 10], "tanh", "categorical")


@functools.lru_cache(maxsize=None)
def _host_inputs(width, seed=0):
    rng = np.random.default_rng(seed)
    theta = model(width).init_theta(rng)
    return theta, rng.standard_normal((M, 50)), rng.integers(0, 10, M)


def inputs(xp, width):
    """(theta, X (M, 50), y (M,) labels in 0..9), fixed seed, on backend xp."""
    return tuple(xp.asarray(a) for a in _host_inputs(width))


def dense_errors(net, theta, X, y, curvature):
    """[e_l] from the dense blocks: Y_l = R_l^T R_l with R_l the layer's columns of the rows
    C_i^T J_i (GGN) or of G (EF), against kron(A_l, B_l) of ``kfac_curvature``."""
    xp = xp_of(theta)
    if curvature == "ggn":
        J = net.jacobian(theta, X)  # (M, K, D)
        C = net.likelihood.hess_factor(net.forward(theta, X), y)  # H_i = C_i C_i^T, (M, K, R)
        rows = (xp.swapaxes(C, 1, 2) @ J).reshape(-1, net.D)  # GGN = rows^T rows
    else:
        rows = net.per_example_grads(theta, X, y)  # EF = G^T G
    out, off = [], 0
    for A, B in net.kfac_curvature(theta, X, y, curvature):
        n = A.shape[0] * B.shape[0]
        R_l = rows[:, off:off + n]
        Y = R_l.T @ R_l
        norm_Y = xp.linalg.norm(Y)
        K = xp.kron(A, B)
        K -= Y
        del Y
        out.append(float(xp.linalg.norm(K) / norm_Y))
        off += n
    return out


class KFACBlockErrors:
    """kfac_block_errors vs the dense blocks, per curvature and hidden width; the ratio
    time_dense / time_structured is the figure. track_dense_rel_err: max_l |e_l - e_l(dense)|
    (e_l is a fraction of ||Y_l||, so this is on the scale 1)."""
    params = (BACKENDS, ["ggn", "ef"], WIDTHS)
    param_names = ["backend", "curvature", "width"]
    number = 1
    repeat = (1, 5, 60.0)
    timeout = 300.0

    def setup(self, name, curvature, width):
        self.xp = backend(name)  # NotImplementedError (skip) without CuPy
        self.net = model(width)
        self.theta, self.X, self.y = inputs(self.xp, width)
        self.net.kfac_block_errors(self.theta, self.X, self.y, curvature)  # warm-up
        if curvature == "ef" and self.xp is np:
            self.net.per_example_grads(self.theta, self.X, self.y)  # numba compile / cache load
        sync(self.xp)

    def structured(self, curvature):
        out = self.net.kfac_block_errors(self.theta, self.X, self.y, curvature)
        sync(self.xp)
        return out

    def dense(self, curvature):
        return dense_errors(self.net, self.theta, self.X, self.y, curvature)

    def time_structured(self, name, curvature, width):
        self.structured(curvature)

    def time_dense(self, name, curvature, width):
        self.dense(curvature)

    def track_dense_rel_err(self, name, curvature, width):
        got = [float(e) for e in self.structured(curvature)["rel_err"]]
        want = self.dense(curvature)
        return max(abs(g - w) for g, w in zip(got, want)) / max(1.0, max(want))

    track_dense_rel_err.unit = "|e - e_dense|"


# ----------------------------------------------------------------------------- without asv

def _median_s(fn, repeat=5):
    import timeit
    fn()
    return float(np.median(timeit.Timer(fn).repeat(repeat=repeat, number=1)))


def main():
    """Median seconds of both routes and their ratio (BLAS threads: REFBAYES_BENCH_THREADS,
    default 1)."""
    print(f"{'case':<28} {'structured s':>13} {'dense s':>10} {'ratio':>8} {'max |de|':>10}")
    for curvature in ["ggn", "ef"]:
        for width in WIDTHS:
            b = KFACBlockErrors()
            b.setup("numpy", curvature, width)
            t_s = _median_s(lambda: b.structured(curvature), repeat=20)
            t_d = _median_s(lambda: b.dense(curvature), repeat=3)
            de = b.track_dense_rel_err("numpy", curvature, width)
            print(f"{curvature + ' w=' + str(width):<28} {t_s:13.4f} {t_d:10.3f} "
                  f"{t_d / t_s:8.1f} {de:10.1e}", flush=True)


if __name__ == "__main__":
    main()
