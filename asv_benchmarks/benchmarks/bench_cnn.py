"""LeNet-5 (refbayes.models.conv.lenet5, D = 62006) on 3x32x32 inputs, M = 128 (issue 34 section 6):
the per-example gradients (float32 and float64), the summed gradient, one Adam step beside one
VOGN step (S = 1, "ef") of the same net and batch, and the Hessian-vector product (closed form
(conv.34)-(conv.36), NumPy and CuPy, beside autograd's reverse over reverse on NumPy), on NumPy
and CuPy.

Issue target: a VOGN step costs at most 3x an Adam step on the same network and batch. The ratio
is read from one process, interleaved (tools/cnn_timing.py prints it, with torch.func and
BackPACK's per-example gradients beside refbayes'); asv's figures come from separate processes.

Inputs: X (M, 3, 32, 32) standard normal and y (M,) labels in 0..9 from default_rng(0); theta
from the model's Glorot initializer (seed 0); N = 50000 (CIFAR-10's training rows), prior
precision 1; the VOGN state at N s = 1e4 (sigma ~ 1e-2) and t = 10, as bench_bnn's.
"""
import functools

import numpy as np

from refbayes.methods import adam, vogn
from refbayes.methods._estimates import Batch
from refbayes.models.conv import lenet5

from .common import BACKENDS, backend, sync

M = 128
N = 50000       # CIFAR-10 training rows
LAM = 1.0       # prior precision
T = 10          # steps already taken
S0 = 1e4 / N    # N s = 1e4: sigma ~ 1e-2
DTYPES = ["float64", "float32"]


def model():
    return lenet5()


@functools.cache
def _host(dtype="float64", M=M):
    """(theta (D,), X (M, 3, 32, 32), y (M,) int labels) on the host, in ``dtype``."""
    net = model()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((M,) + net.input_shape).astype(dtype)
    y = rng.integers(0, net.n_out, M)
    return net.init_theta(np.random.default_rng(0), dtype=np.dtype(dtype)), X, y


def inputs(xp, dtype="float64", M=M):
    return tuple(xp.asarray(a) for a in _host(dtype, M))


def step_case(xp, method, dtype="float64", M=M, S=1):
    """A zero-argument callable running one "adam" or "vogn-ef" / "vogn-ggn" step (S draws) on
    LeNet-5, the inputs built once; X passed as rows (M, 3072), the methods' 2-D form."""
    net = model()
    theta, X, y = inputs(xp, dtype, M)
    batch = Batch(xp.ascontiguousarray(X.reshape(M, -1)), y)
    if method == "adam":
        st, cfg = adam.init(theta)._replace(t=T), adam.AdamConfig()
        return lambda: adam.step(st, batch, cfg, net, N, LAM)
    st = vogn.init(theta, xp.full(net.D, S0, dtype=theta.dtype))._replace(t=T)
    cfg = vogn.VOGNConfig(N, LAM, curvature=method[5:])
    eps = xp.asarray(np.random.default_rng(1).standard_normal((net.D, S)).astype(dtype))
    return lambda: vogn.step(st, batch, eps, cfg, net)


class LeNetPerExampleGrads:
    """G (M, D) by the vectorized closed form (conv.6)-(conv.7), float64 and float32: into a fresh
    array, and into a preallocated ``out`` (no (M, D) allocation; issue 34 section 6 compares
    both with torch.func and BackPACK in tools/cnn_timing.py)."""
    params = (BACKENDS, DTYPES)
    param_names = ["backend", "dtype"]

    def setup(self, name, dtype):
        self.xp = backend(name)
        self.net = model()
        self.theta, self.X, self.y = inputs(self.xp, dtype)
        self.out = self.xp.empty((M, self.net.D), dtype=dtype)
        self.net.per_example_grads(self.theta, self.X, self.y, impl="vectorized")
        self.net.per_example_grads(self.theta, self.X, self.y, out=self.out)
        sync(self.xp)

    def time_per_example_grads(self, name, dtype):
        self.net.per_example_grads(self.theta, self.X, self.y, impl="vectorized")
        sync(self.xp)

    def time_per_example_grads_out(self, name, dtype):
        self.net.per_example_grads(self.theta, self.X, self.y, out=self.out)
        sync(self.xp)


class LeNetGrad:
    """The summed gradient (conv.8): Adam's per-step model cost."""
    params = (BACKENDS, DTYPES)
    param_names = ["backend", "dtype"]

    def setup(self, name, dtype):
        self.xp = backend(name)
        self.net = model()
        self.theta, self.X, self.y = inputs(self.xp, dtype)
        self.net.grad(self.theta, self.X, self.y)
        sync(self.xp)

    def time_grad(self, name, dtype):
        self.net.grad(self.theta, self.X, self.y)
        sync(self.xp)


class LeNetStep:
    """One Adam step and one VOGN step (S = 1, "ef"), float64: the ratio to "adam" is the figure
    (target: at most 3x)."""
    params = (BACKENDS, ["adam", "vogn-ef"])
    param_names = ["backend", "method"]

    def setup(self, name, method):
        self.xp = backend(name)
        self.run = step_case(self.xp, method)
        self.run()
        sync(self.xp)

    def time_step(self, name, method):
        self.run()
        sync(self.xp)


class LeNetVOGNDraws:
    """VOGN steps ("ef") with S = 1, 3, 10 draws, float64 and float32 (issue 37 item 3 on
    LeNet-5): the goal is S draws at most S times the S = 1 step; the S passes share the first
    conv's unfolded input (conv._first_unfold)."""
    params = (BACKENDS, [1, 3, 10], DTYPES)
    param_names = ["backend", "S", "dtype"]

    def setup(self, name, S, dtype):
        self.xp = backend(name)
        self.run = step_case(self.xp, "vogn-ef", dtype, S=S)
        self.run()
        sync(self.xp)

    def time_step(self, name, S, dtype):
        self.run()
        sync(self.xp)


class LeNetHVP:
    """H v on LeNet-5, float64, M = 32 and 128: the closed-form R-operator ("closed",
    (conv.34)-(conv.36), what riemannian_laplace's geodesic steps call through grad_hvp) and
    autograd's reverse-over-reverse product ("autograd", NumPy only, the oracle). v standard
    normal from default_rng(2)."""
    params = (BACKENDS, ["closed", "autograd"], [32, 128])
    param_names = ["backend", "impl", "M"]

    def setup(self, name, impl, M):
        if impl == "autograd" and name != "numpy":
            raise NotImplementedError("autograd is NumPy only")
        self.xp = backend(name)
        self.net = model()
        self.theta, self.X, self.y = inputs(self.xp, "float64", M)
        self.v = self.xp.asarray(np.random.default_rng(2).standard_normal(self.net.D))
        self.fn = self.net.hvp if impl == "closed" else self.net._hvp_autograd
        self.fn(self.theta, self.v, self.X, self.y)
        sync(self.xp)

    def time_hvp(self, name, impl, M):
        self.fn(self.theta, self.v, self.X, self.y)
        sync(self.xp)
