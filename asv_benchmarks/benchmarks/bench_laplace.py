"""The Laplace approximation (refbayes.methods.laplace) and the geodesic of the Riemannian Laplace
approximation (refbayes.methods.riemannian_laplace) on the regression net of the RLA paper: an MLP
with one hidden layer of 15 tanh units, 1-D input and output (D = 15 + 15 + 15 + 1 = 46).

Inputs: a 1-D toy regression, x ~ U(-3, 3), y = sin(2 x) + N(0, 0.2^2), the Gaussian likelihood
with noise_precision = 25 (the data's); theta0 from the model's initializer (seed 0), not a MAP:
the cost of ``fit`` and ``glm_predictive`` does not depend on theta (``fit`` runs with
check_stationary=False: its stationarity check, one gradient pass, would warn at theta0), and a
MAP of this net is slow to reach (L-BFGS: ~0.3-0.8 s, ~600-1500 iterations) and makes the
geodesics much longer (see ExpMap). ``laplace`` runs on CuPy except for the curvature "hessian"
of this MLP (autograd's); the Riemannian Laplace geodesic is NumPy-only (the ODE is scipy's):
those "cupy" cases are skipped (setup raises NotImplementedError). The CuPy cases
build their inputs on the host and copy them to the device once, in setup.

- LaplaceFit: ``laplace.fit`` for every structure x curvature, N training rows. The Hessian at
  theta0 is indefinite (its smallest eigenvalue is about -2e3 at N = 100), so ``fit`` would raise
  for curvature "hessian": every case uses the prior precision delta(N) = 1 + max(0,
  -lambda_min(H(theta0))) + 1, which makes H + delta I (and diag(H) + delta, as
  lambda_min <= min diag H) positive definite, the same delta for all six cases of one N (the
  GGN / EF costs do not depend on delta): delta = 2.1e3, 2.0e4, 2.0e5 at N = 1e2, 1e3, 1e4.
- Subset: ``laplace.fit`` (GGN) of a wider net, all parameters vs the last layer, per structure.
- GLMPredictive: ``laplace.glm_predictive`` (full and diag GGN states, N = 100, prior 1) at M
  test points on a grid of [-4, 4].
- GLMClassPredictive: ``laplace.glm_class_predictive`` on the same net with two logits and the
  categorical likelihood (labels sin(2 x) + noise > 0; theta0 from seed 0, prior 1, N = 100),
  probit vs Monte Carlo (S = 100 fixed draws) links, full and diag, M test points.
- OptimizePriorPrecision: ``laplace.optimize_prior_precision`` on the GLM-predictive state
  (full GGN, N = 100): "lbfgs" and "adam" over one delta and the noise precision, "grid" over
  laplace-torch's 100 values; ``track_evaluations`` counts evidence evaluations.
- ExpMapWidth: one geodesic at the official tolerances vs the hidden width (D = 16 .. 451).
- GeodesicRHS: one right-hand side of the geodesic ODE (``geodesic_acceleration`` with
  ``loss_fns``), the closed-form HVP vs autograd's, D = 46 and D = 2701.
- ExpMap: one ``riemannian_laplace.exp_map`` from theta0 with L = sum_i l_i + |theta|^2 / 2
  (prior precision 1), v a draw from the GGN Laplace posterior at theta0, N(0, (GGN + I)^{-1});
  hvp_fn model.hvp (the closed-form R-operator, no D x D matrix: the "hvp" path), autograd's
  reverse-over-reverse product ("autograd", what "hvp" was before the R-operator) or
  model.hessian(c) @ u (the dense D x D autograd Hessian at every right-hand-side evaluation:
  "dense"), each plus the prior term, as tests/methods/test_riemannian_laplace.py builds them. Solver at the config
  defaults (RK45, rtol 1e-6, atol 1e-3, the official code's) and at a tight tolerance (DOP853,
  rtol = atol = 1e-10). ``track_nfev`` is the solver's right-hand-side evaluations (one grad_fn
  and one hvp_fn call each), which is the same for all paths up to rounding. From theta0 a
  geodesic takes 80 / 62 evaluations at the defaults and 494 / 398 tight (N = 20 / 100); from an
  L-BFGS MAP of this net, with v drawn the same way there (measured once on the dev machine),
  482 / 1496 at the defaults and 1646 at N = 20 tight (at N = 100 the tight solve left the
  region where the loss is finite): time per evaluation is the figure, nfev the multiplier.

asv times whatever BLAS threading the process starts with; for one-core figures:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        asv run --python=same -b bench_laplace

``python -m benchmarks.bench_laplace`` (from asv_benchmarks/) prints the median time of every
case with timeit, in one process.
"""
import functools

import numpy as np

from refbayes.methods import laplace
from refbayes.methods import riemannian_laplace as rl
from refbayes.models import MLP

from .common import BACKENDS, backend

NOISE_PRECISION = 25.0   # y = sin(2 x) + N(0, 0.2^2)
PRIOR = 1.0              # prior precision of the GLM predictive and the geodesic's L
NS_FIT = [100, 1000, 10000]
NS_GEODESIC = [20, 100]
MS = [100, 1000]
N_PRED = 100             # training rows of the GLM predictive's state
TOLS = {"default": rl.RiemannianLaplaceConfig(),
        "tight": rl.RiemannianLaplaceConfig("DOP853", rtol=1e-10, atol=1e-10)}


def model():
    return MLP([1, 15, 1], "tanh", "gaussian", noise_precision=NOISE_PRECISION)


@functools.cache
def theta0():
    return model().init_theta(np.random.default_rng(0))


@functools.cache
def data(N, seed=0):
    """(X (N, 1), y (N,)): x ~ U(-3, 3), y = sin(2 x) + 0.2 eps, float64."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (N, 1))
    y = np.sin(2.0 * X[:, 0]) + rng.standard_normal(N) / np.sqrt(NOISE_PRECISION)
    return X, y


@functools.cache
def fit_prior_precision(N):
    """delta(N) = 1 + max(0, -lambda_min(H(theta0))) + 1: H + delta I is positive definite."""
    H = model().hessian(theta0(), *data(N))
    return 2.0 + max(0.0, -float(np.linalg.eigvalsh(H)[0]))


def _numpy_only(name):
    """NotImplementedError (asv: skip) for any backend but NumPy."""
    if name != "numpy":
        raise NotImplementedError(f"backend {name!r}: the Laplace Hessian / HVP (autograd) and the "
                                  "geodesic ODE (scipy) are NumPy-only")


def _laplace_backend(name, curvature="ggn"):
    """The namespace of a laplace case: CuPy too, but for the MLP's autograd Hessian."""
    if curvature == "hessian":
        _numpy_only(name)
    return backend(name)


class LaplaceFit:
    """laplace.fit: the curvature of the summed loss over N rows (D = 46) plus the prior; "full"
    adds a Cholesky check of the 46 x 46 precision. "hessian" is the dense autograd Hessian."""
    params = (BACKENDS, laplace.STRUCTURES, laplace.CURVATURES, NS_FIT)
    param_names = ["backend", "structure", "curvature", "N"]
    timeout = 180.0

    def setup(self, name, structure, curvature, N):
        xp = _laplace_backend(name, curvature)
        if structure == "kron" and curvature == "hessian":
            raise NotImplementedError("structure 'kron' factors the GGN or the EF, not the Hessian")
        self.net = model()
        self.X, self.y = (xp.asarray(a) for a in data(N))
        self.theta = xp.asarray(theta0())
        self.cfg = laplace.LaplaceConfig(fit_prior_precision(N), structure, curvature)
        self.run()  # warm-up: numba compilation or cache load (per-example gradients)

    def run(self):
        return laplace.fit(self.net, self.theta, self.X, self.y, self.cfg,
                           check_stationary=False)

    def time_fit(self, name, structure, curvature, N):
        self.run()


class GLMPredictive:
    """laplace.glm_predictive at M test points: the Jacobian (M, 1, 46), then a triangular solve
    with the Cholesky factor ("full") or a scaling ("diag")."""
    params = (BACKENDS, laplace.STRUCTURES, MS)
    param_names = ["backend", "structure", "M"]

    def setup(self, name, structure, M):
        xp = _laplace_backend(name)
        self.net = model()
        cfg = laplace.LaplaceConfig(PRIOR, structure, "ggn")
        self.state = laplace.fit(self.net, xp.asarray(theta0()),
                                 *(xp.asarray(a) for a in data(N_PRED)), cfg,
                                 check_stationary=False)
        self.X_star = xp.asarray(np.linspace(-4.0, 4.0, M)[:, None])
        self.run()

    def run(self):
        return laplace.glm_predictive(self.net, self.state, self.X_star)

    def time_glm_predictive(self, name, structure, M):
        self.run()


class Subset:
    """laplace.fit with the GGN on a wider net, MLP [1, 50, 50, 1] (D = 2701; the last layer has
    51 parameters), N = 1000: all parameters vs the last layer, for each structure. "full" over
    all parameters forms and factors the 2701 x 2701 precision; the last layer's is 51 x 51."""
    params = (BACKENDS, laplace.STRUCTURES, list(laplace.SUBSETS))
    param_names = ["backend", "structure", "subset"]
    timeout = 180.0

    def setup(self, name, structure, subset):
        xp = _laplace_backend(name)
        self.net = MLP([1, 50, 50, 1], "tanh", "gaussian", noise_precision=NOISE_PRECISION)
        self.theta = xp.asarray(self.net.init_theta(np.random.default_rng(0)))
        self.X, self.y = (xp.asarray(a) for a in data(1000))
        self.cfg = laplace.LaplaceConfig(PRIOR, structure, "ggn", subset)
        self.run()

    def run(self):
        return laplace.fit(self.net, self.theta, self.X, self.y, self.cfg,
                           check_stationary=False)

    def time_fit(self, name, structure, subset):
        self.run()


@functools.cache
def _velocity(N):
    """v = theta_s - theta0, theta_s drawn from the GGN Laplace posterior at theta0 (prior 1)."""
    state = laplace.fit(model(), theta0(), *data(N), laplace.LaplaceConfig(PRIOR, "full", "ggn"),
                        check_stationary=False)
    eps = np.random.default_rng(1).standard_normal((model().D, 1))
    return laplace.sample(state, eps)[:, 0] - theta0()


def geodesic_case(path, tol, N):
    """A zero-argument callable running one exp_map (inputs built once)."""
    net = model()
    X, y = data(N)
    eye = np.eye(net.D)

    def grad_fn(theta):
        return net.grad(theta, X, y) + PRIOR * theta

    if path == "hvp":
        def hvp_fn(theta, u):
            return net.hvp(theta, u, X, y) + PRIOR * u
    elif path == "autograd":
        def hvp_fn(theta, u):
            return net._hvp_autograd(theta, u, X, y) + PRIOR * u
    elif path == "dense":
        def hvp_fn(theta, u):
            return (net.hessian(theta, X, y) + PRIOR * eye) @ u
    else:
        raise ValueError(f"path: expected 'hvp', 'autograd' or 'dense', got {path!r}")
    theta, v, cfg = theta0(), _velocity(N), TOLS[tol]
    return lambda: rl.exp_map(theta, v, grad_fn, hvp_fn, cfg)[1]


class ExpMap:
    """One geodesic Exp_theta0(v): the closed-form HVP (R-operator), autograd's HVP and the
    dense-Hessian path, default vs tight solver.

    Seconds per geodesic: the dense path at the tight tolerance runs ~20 s (one sample)."""
    params = (BACKENDS, ["hvp", "autograd", "dense"], list(TOLS), NS_GEODESIC)
    param_names = ["backend", "path", "tol", "N"]
    number = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0.0
    timeout = 300.0

    def setup(self, name, path, tol, N):
        _numpy_only(name)
        self.run = geodesic_case(path, tol, N)  # no warm-up: nothing is compiled

    def time_exp_map(self, name, path, tol, N):
        self.run()

    def track_nfev(self, name, path, tol, N):
        return self.run().nfev

    track_nfev.unit = "rhs evaluations"



class GeodesicRHS:
    """One right-hand side of the geodesic ODE, ``geodesic_acceleration`` with the (grad_fn,
    hvp_fn) of ``riemannian_laplace.loss_fns`` (N = 100 rows, prior 1): hvp_fn by the closed-form
    R-operator (the library's) vs by autograd's reverse-over-reverse product, on the paper's
    regression net (D = 46) and a wider one, MLP [1, 50, 50, 1] (D = 2701)."""
    params = (BACKENDS, ["closed-form", "autograd"], [15, 50])
    param_names = ["backend", "hvp", "width"]

    def setup(self, name, hvp, width):
        _numpy_only(name)
        net = model() if width == 15 else MLP([1, 50, 50, 1], "tanh", "gaussian",
                                               noise_precision=NOISE_PRECISION)
        X, y = data(100)
        grad_fn, hvp_fn = rl.loss_fns(net, X, y, PRIOR)
        if hvp == "autograd":
            def hvp_fn(theta, u):
                return net._hvp_autograd(theta, u, X, y) + PRIOR * u
        rng = np.random.default_rng(3)
        self.args = (grad_fn, hvp_fn, 0.3 * rng.standard_normal(net.D),
                     rng.standard_normal(net.D))

    def time_rhs(self, name, hvp, width):
        rl.geodesic_acceleration(*self.args)


def class_model():
    """The same net with two logits and the categorical likelihood (D = 15 + 15 + 30 + 2 = 62)."""
    return MLP([1, 15, 2], "tanh", "categorical")


@functools.cache
def class_data(N, seed=0):
    """(X (N, 1), y (N,)): x ~ U(-3, 3), y = 1 where sin(2 x) + 0.2 eps > 0, else 0."""
    X, y = data(N, seed)
    return X, (y > 0).astype(np.int64)


class GLMClassPredictive:
    """laplace.glm_class_predictive at M test points (categorical, K = 2): the Jacobian
    (M, 2, 62) and J Sigma J^T, then the probit link or S = 100 Monte Carlo draws through a
    batched 2 x 2 Cholesky (eps fixed, seed 2)."""
    params = (BACKENDS, laplace.STRUCTURES[:2], laplace.LINKS, MS)
    param_names = ["backend", "structure", "link", "M"]

    def setup(self, name, structure, link, M):
        xp = _laplace_backend(name)
        self.net = class_model()
        theta = xp.asarray(self.net.init_theta(np.random.default_rng(0)))
        cfg = laplace.LaplaceConfig(PRIOR, structure, "ggn")
        self.state = laplace.fit(self.net, theta, *(xp.asarray(a) for a in class_data(N_PRED)), cfg,
                                 check_stationary=False)
        self.X_star = xp.asarray(np.linspace(-4.0, 4.0, M)[:, None])
        self.link = link
        self.eps = (xp.asarray(np.random.default_rng(2).standard_normal((2, 100)))
                    if link == "mc" else None)
        self.run()

    def run(self):
        return laplace.glm_class_predictive(self.net, self.state, self.X_star, self.link,
                                            self.eps)

    def time_glm_class_predictive(self, name, structure, link, M):
        self.run()


class OptimizePriorPrecision:
    """laplace.optimize_prior_precision on the regression net (full GGN state, N = 100):
    "lbfgs" and "adam" (100 steps) for one delta and the noise precision, "grid" over
    laplace-torch's 100 values. Each evidence evaluation is one Cholesky of the 46 x 46
    precision and one triangular inverse (diag(Sigma)); ``track_evaluations`` counts them."""
    params = (BACKENDS, list(laplace.TUNING_METHODS))
    param_names = ["backend", "method"]

    def setup(self, name, method):
        _numpy_only(name)
        self.net = model()
        self.X, self.y = data(N_PRED)
        self.cfg = laplace.LaplaceConfig(PRIOR, "full", "ggn")
        self.state = laplace.fit(self.net, theta0(), self.X, self.y, self.cfg,
                                 check_stationary=False)
        self.method = method
        self.run()

    def run(self):
        return laplace.optimize_prior_precision(self.net, self.state, self.X, self.y, self.cfg,
                                                self.method,
                                                optimize_noise=self.method != "grid")[1]

    def time_optimize_prior_precision(self, name, method):
        self.run()

    def track_evaluations(self, name, method):
        return len(self.run().trace_log_marglik)

    track_evaluations.unit = "evidence evaluations"

class ExpMapWidth:
    """One geodesic (HVP path, official tolerances) vs the hidden width of the 1-H-1 tanh net,
    D = 3 H + 1, N = 100, from theta0 with v drawn as in ExpMap: the time per geodesic against D
    (the HVP cost grows with D, the number of evaluations with the geodesic's curvature)."""
    params = (BACKENDS, [5, 15, 50, 150])
    param_names = ["backend", "width"]
    number = 1
    repeat = (1, 5, 30.0)
    warmup_time = 0.0
    timeout = 300.0

    def setup(self, name, width):
        _numpy_only(name)
        net = MLP([1, width, 1], "tanh", "gaussian", noise_precision=NOISE_PRECISION)
        X, y = data(100)
        theta = net.init_theta(np.random.default_rng(0))
        state = laplace.fit(net, theta, X, y, laplace.LaplaceConfig(PRIOR, "full", "ggn"),
                            check_stationary=False)
        v = laplace.sample(state, np.random.default_rng(1).standard_normal((net.D, 1)))[:, 0] - theta
        grad_fn, hvp_fn = rl.loss_fns(net, X, y, PRIOR)
        cfg = TOLS["default"]
        self.run = lambda: rl.exp_map(theta, v, grad_fn, hvp_fn, cfg)[1]

    def time_exp_map(self, name, width):
        self.run()

    def track_nfev(self, name, width):
        return self.run().nfev

    track_nfev.unit = "rhs evaluations"


# ----------------------------------------------------------------------------- without asv

def _median_ms(fn, min_time=0.3, repeat=5):
    import timeit
    timer = timeit.Timer(fn)
    first = timer.timeit(1)
    number = max(1, int(min_time / repeat / max(first, 1e-9)))
    if first * repeat > 20.0:  # a long geodesic: the first call is the sample
        return 1e3 * first
    return 1e3 * float(np.median(timer.repeat(repeat=repeat, number=number))) / number


def main():
    """Median ms of every case, in one process (BLAS threads: REFBAYES_BENCH_THREADS, default 1)."""
    print(f"{'case':<40} {'ms':>10}")
    for s in laplace.STRUCTURES:
        for c in laplace.CURVATURES:
            if s == "kron" and c == "hessian":
                continue
            for N in NS_FIT:
                b = LaplaceFit()
                b.setup("numpy", s, c, N)
                print(f"{'fit ' + s + ' ' + c + ' N=' + str(N):<40} {_median_ms(b.run):10.3f}",
                      flush=True)
    for s in laplace.STRUCTURES:
        for M in MS:
            b = GLMPredictive()
            b.setup("numpy", s, M)
            print(f"{'glm_predictive ' + s + ' M=' + str(M):<40} {_median_ms(b.run):10.3f}",
                  flush=True)
    for s in laplace.STRUCTURES:
        for subset in laplace.SUBSETS:
            b = Subset()
            b.setup("numpy", s, subset)
            print(f"{'fit D=2701 ' + s + ' ' + subset:<40} {_median_ms(b.run):10.3f}", flush=True)
    for s in laplace.STRUCTURES[:2]:
        for link in laplace.LINKS:
            for M in MS:
                b = GLMClassPredictive()
                b.setup("numpy", s, link, M)
                label = f"glm_class_predictive {s} {link} M={M}"
                print(f"{label:<40} {_median_ms(b.run):10.3f}", flush=True)
    for method in laplace.TUNING_METHODS:
        b = OptimizePriorPrecision()
        b.setup("numpy", method)
        label = f"optimize_prior_precision {method}"
        print(f"{label:<40} {_median_ms(b.run):10.3f}", flush=True)
    for width in ExpMapWidth.params[1]:
        b = ExpMapWidth()
        b.setup("numpy", width)
        nfev = b.run().nfev
        label = f"exp_map width={width} (nfev {nfev})"
        print(f"{label:<40} {_median_ms(b.run):10.3f}", flush=True)
    for hvp in GeodesicRHS.params[1]:
        for width in GeodesicRHS.params[2]:
            b = GeodesicRHS()
            b.setup("numpy", hvp, width)
            label = f"geodesic rhs {hvp} width={width}"
            rhs = functools.partial(b.time_rhs, "numpy", hvp, width)
            print(f"{label:<40} {_median_ms(rhs):10.3f}", flush=True)
    for N in NS_GEODESIC:
        for tol in TOLS:
            for path in ExpMap.params[1]:
                fn = geodesic_case(path, tol, N)
                nfev = fn().nfev
                label = f"exp_map {path} {tol} N={N} (nfev {nfev})"
                print(f"{label:<40} {_median_ms(fn):10.3f}", flush=True)


if __name__ == "__main__":
    main()
