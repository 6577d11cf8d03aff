"""Per-example gradients of a one-hidden-layer MLP on kin8nm-sized inputs (8 features, regression).

Issue target: numba within 2x of the vectorized closed form, and at least 20x faster than the
autograd loop, at width 50 and M = 128.

The default on NumPy (numba) is chosen by this comparison. Measured in one process, CPU time, one
thread, with the machine otherwise idle (median of 5): numba / vectorized = 0.57 ([8, 50, 1],
M = 10), 0.58 (M = 32), 0.87 (M = 128), 0.89 ([8, 200, 1], M = 32), 1.04 (M = 128), 0.79
([8, 50, 50, 1], M = 128), 0.92 ([784, 100, 10], M = 32), 0.88 ([14, 1], M = 32). At
[784, 100, 10], M = 128 (an 81 MB G) both took 24-26 ms in a process of its own, but numba 141-192
ms in one that had run the other shapes first, 91-94 % of it kernel (system) time, not
arithmetic; why that process's page faults hit the numba path and not the vectorized one was not
found then. Issue 37 found two parts of it (per_example_gradients_experiments.md): a fresh 81 MB G
is above glibc's 32 MB retained-memory threshold, so its pages are faulted in on every call, and
the numba row loop's 2-d indexed stores were not vectorized (now 1-d row views); the 141-192 ms
case itself was not re-measured.

Issue 37 (item 5), ``PerExampleGradsMnist``: [784, 100, 10], M = 128, float64 (an 81 MB G) against
the output-write floor, a fresh (M, D) array with every entry written once (``np.empty`` +
``fill``), and with ``out=`` (rows of a reused buffer, as SLANG's W^T) against the same write into a
reused buffer. The numba kernel's row loop writes through 1-d row views since issue 37 (3x faster
at this shape, the same products); figures in derivations/per_example_gradients_experiments.md.
"""
import numpy as np

from refbayes.models import MLP

from .common import BACKENDS, backend, regression_batch, sync


class PerExampleGrads:
    params = (["numba", "vectorized", "autograd"], [50, 200], [32, 128])
    param_names = ["impl", "width", "M"]

    def setup(self, impl, width, M):
        self.model = MLP([8, width, 1], activation="relu", likelihood="gaussian")
        self.theta = self.model.init_theta(np.random.default_rng(0))
        self.X, self.y = regression_batch(np, M)
        self.model.per_example_grads(self.theta, self.X, self.y, impl=impl)  # numba compile / cache load

    def time_per_example_grads(self, impl, width, M):
        self.model.per_example_grads(self.theta, self.X, self.y, impl=impl)


class PerExampleGradsBackend:
    """The vectorized closed form on each backend (the CuPy path of every method)."""
    params = (BACKENDS, [50, 200], [32, 128])
    param_names = ["backend", "width", "M"]

    def setup(self, name, width, M):
        self.xp = backend(name)
        self.model = MLP([8, width, 1], activation="relu", likelihood="gaussian")
        self.theta = self.xp.asarray(self.model.init_theta(np.random.default_rng(0)))
        self.X, self.y = regression_batch(self.xp, M)
        self.model.per_example_grads(self.theta, self.X, self.y, impl="vectorized")
        sync(self.xp)

    def time_vectorized(self, name, width, M):
        self.model.per_example_grads(self.theta, self.X, self.y, impl="vectorized")
        sync(self.xp)


class PerExampleGradsDraws:
    """G (S, M, D) at S Monte Carlo draws (what SLANG and full NGVI-EF take per step): a loop
    of S per_example_grads calls (the default implementation) against one batched pass,
    on the UCI SLANG shape ([8, 50, 1], M = 10, S = 4), logistic regression (australian:
    D = 15, M = 32, S = 12) and an MNIST MLP ([784, 100, 10], M = 128, S = 10)."""
    params = (["loop", "batched"], ["uci", "logreg", "mnist-mlp"])
    param_names = ["impl", "shape"]
    SHAPES = {"uci": ([8, 50, 1], "gaussian", 10, 4), "logreg": ([14, 1], "bernoulli", 32, 12),
              "mnist-mlp": ([784, 100, 10], "categorical", 128, 10)}

    def setup(self, impl, shape):
        sizes, lik, M, S = self.SHAPES[shape]
        rng = np.random.default_rng(0)
        self.model = MLP(sizes, activation="relu", likelihood=lik)
        self.thetas = 0.1 * rng.standard_normal((S, self.model.D))
        self.X = rng.standard_normal((M, sizes[0]))
        self.y = rng.standard_normal(M) if lik == "gaussian" else rng.integers(0, max(2, sizes[-1]), M)
        loop = np.stack([self.model.per_example_grads(t, self.X, self.y) for t in self.thetas])
        batched = self.model.per_example_grads_batched(self.thetas, self.X, self.y)
        if not np.allclose(loop, batched, rtol=1e-12, atol=1e-14):
            raise AssertionError("batched per-example gradients differ from the loop")

    def time_draws(self, impl, shape):
        if impl == "loop":
            for t in self.thetas:
                self.model.per_example_grads(t, self.X, self.y)
        else:
            self.model.per_example_grads_batched(self.thetas, self.X, self.y)


class PerExampleGradsMnist:
    """[784, 100, 10], M = 128, float64: each impl into a fresh G ("fresh") or a reused buffer
    ("out"), beside the output-write floor of each ("floor": np.empty + fill, or fill alone)."""
    params = (["numba", "vectorized", "floor"], ["fresh", "out"])
    param_names = ["impl", "output"]

    def setup(self, impl, output):
        rng = np.random.default_rng(0)
        self.model = MLP([784, 100, 10], activation="relu", likelihood="categorical")
        self.theta = self.model.init_theta(rng)
        self.X, self.y = rng.standard_normal((128, 784)), rng.integers(0, 10, 128)
        self.buf = np.empty((128, self.model.D))
        self.time_grads(impl, output)  # numba compile / cache load; the buffer's pages touched

    def time_grads(self, impl, output):
        if impl == "floor":
            G = np.empty((128, self.model.D)) if output == "fresh" else self.buf
            G.fill(1.0)
            return
        out = None if output == "fresh" else self.buf
        self.model.per_example_grads(self.theta, self.X, self.y, impl=impl, out=out)
