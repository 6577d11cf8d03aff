"""Per-example gradients of a one-hidden-layer MLP on kin8nm-sized inputs (8 features, regression).

Issue target: numba within 2x of the vectorized closed form, and at least 20x faster than the
autograd loop, at width 50 and M = 128.
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
