"""Every float hyperparameter of every method, checked where it enters (issue 9, items 4 and 5).

The Config classes and their fields are found by introspection (every ``*Config`` NamedTuple of
every module of refbayes.methods; every field that is not an int, str or bool, nested configs
included), so a new Config or field cannot be missed: each Config must have its consumers listed
in ``CONSUMERS``, and each one must reject NaN and +-inf (and arrays holding them) with a
ValueError naming ``cfg.<field>``. The float arguments of public functions (methods, linalg,
models) are listed in ``FLOAT_ARGS``, and a scan of the public signatures checks that the list is
complete. Also: symmetry of every dense precision / covariance a method takes, and the step-size
schedule (ngvi.12) that SLANG and NGVI report in their Info and use in their updates.
"""
from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import re
import warnings

import numpy as np
import pytest

import refbayes.linalg
import refbayes.methods
import refbayes.models
from refbayes.linalg import kron
from refbayes.methods import (
    adam,
    bbb,
    ktied,
    driver,
    exact_vi,
    laplace,
    mc_dropout,
    ngvi,
    noise_gamma,
    noisy_adam,
    noisy_kfac,
    riemannian_laplace,
    slang,
    swag,
    vadam,
    vogn,
)
from refbayes.models import CNN, MLP, Gaussian, LogisticRegression, make_likelihood, tiny_cnn
from refbayes.models import dropout as masked
from tests.tolerances import EXACT_F64, assert_close

# fit here is mostly at points that are not a MAP (the identities tested hold at any theta); its
# non-stationarity UserWarning is tested in test_laplace.py (test_fit_warns_away_from_a_minimum)
pytestmark = pytest.mark.filterwarnings(
    "ignore:laplace.fit. theta_map is not a stationary point:UserWarning")

NAN, INF = float("nan"), float("inf")
N, P, M = 20, 3, 5

_rng = np.random.default_rng(0)
X = _rng.standard_normal((N, P))
Y = (_rng.random(N) > 0.5).astype(float)
Y_REAL = _rng.standard_normal(N)
MODEL = LogisticRegression(P)
D = MODEL.D
BATCH = (X[:M], Y[:M])
EPS = _rng.standard_normal((D, 2))
NET = MLP([P, 4, 1], activation="tanh", likelihood="bernoulli")
THETA = NET.init_theta(np.random.default_rng(1))
MASKS = driver.draw_masks(np.random.default_rng(2), NET, M, 0.1)
XD = np.concatenate([X, np.ones((N, 1))], axis=1)


# ----------------------------------------------------------------------------- the configs

def _config_classes():
    """Every ``*Config`` NamedTuple defined in a module of refbayes.methods."""
    found = {}
    for info in pkgutil.iter_modules(refbayes.methods.__path__):
        mod = importlib.import_module(f"refbayes.methods.{info.name}")
        for name, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields")
                    and name.endswith("Config") and obj.__module__ == mod.__name__):
                found[f"{info.name}.{name}"] = obj
    return found


BASE = {
    slang.SLANGConfig: slang.SLANGConfig(N, np.ones(D), L=1),
    ngvi.NGVIConfig: ngvi.NGVIConfig(N, np.ones(D)),
    vogn.VOGNConfig: vogn.VOGNConfig(N, 1.0),
    vadam.VadamConfig: vadam.VadamConfig(N, 1.0),
    noisy_adam.NoisyAdamConfig: noisy_adam.NoisyAdamConfig(N, 1.0),
    bbb.BBBConfig: bbb.BBBConfig(N, 1.0),
    mc_dropout.MCDropoutConfig: mc_dropout.MCDropoutConfig(N),
    adam.AdamConfig: adam.AdamConfig(),
    adam.MAPConfig: adam.MAPConfig(N, 0.5),
    laplace.LaplaceConfig: laplace.LaplaceConfig(1.0),
    riemannian_laplace.RiemannianLaplaceConfig: riemannian_laplace.RiemannianLaplaceConfig(),
    noisy_kfac.NoisyKFACConfig: noisy_kfac.NoisyKFACConfig(N),
    swag.SGDConfig: swag.SGDConfig(N, 0.5),
    swag.SWAGConfig: swag.SWAGConfig(K=2),
    noise_gamma.NoiseGammaConfig: noise_gamma.NoiseGammaConfig(N),
}

_SLANG0 = slang.init(np.zeros(D), np.zeros((D, 1)), np.ones(D))
_FULL0 = ngvi.init_full(np.zeros(D), np.eye(D))
_MF0 = ngvi.init_meanfield(np.zeros(D), np.ones(D))
_VOGN0 = vogn.init(np.zeros(D), np.ones(D))
_VADAM0 = vadam.init(np.zeros(D))
_NOISY0 = noisy_adam.init(np.zeros(D))
_BBB0 = bbb.init(np.zeros(D), sigma0=0.5)
_MCD0 = mc_dropout.init(THETA)
_MAP0 = adam.init(np.zeros(D))
_RL_GRAD = lambda th: MODEL.grad(th, X, Y) + th  # noqa: E731  (L = summed loss + |theta|^2 / 2)
_RL_HVP = lambda th, u: MODEL.hvp(th, u, X, Y) + u  # noqa: E731
_NKFAC0 = noisy_kfac.init(THETA, NET)
_SGD0 = swag.sgd_init(np.zeros(D))
_SWAG0 = swag.collect(swag.collect(swag.init(X[0], swag.SWAGConfig(K=2)), X[0],
                                   swag.SWAGConfig(K=2))[0], X[1], swag.SWAGConfig(K=2))[0]
with warnings.catch_warnings():  # theta = 0 is not a MAP: fit's UserWarning, not tested here
    warnings.filterwarnings("ignore", "laplace.fit: theta_map is not a stationary", UserWarning)
    _LAP0 = laplace.fit(MODEL, np.zeros(D), X, Y, laplace.LaplaceConfig(1.0))

# the public functions that consume each Config (every one must validate it)
CONSUMERS = {
    slang.SLANGConfig: {"step": lambda c: slang.step(_SLANG0, BATCH, EPS, c, MODEL)},
    ngvi.NGVIConfig: {
        "step_full": lambda c: ngvi.step_full(_FULL0, BATCH, EPS, c, MODEL),
        "step_meanfield": lambda c: ngvi.step_meanfield(_MF0, BATCH, EPS, c, MODEL),
    },
    vogn.VOGNConfig: {
        "step": lambda c: vogn.step(_VOGN0, BATCH, EPS, c, MODEL),
        "local_estimates": lambda c: vogn.local_estimates(_VOGN0, BATCH, EPS, c, MODEL),
        "apply": lambda c: vogn.apply(_VOGN0, np.ones(D), np.ones(D), c),
        "sample": lambda c: vogn.sample(_VOGN0, EPS, c),
        "prec_diag": lambda c: vogn.prec_diag(_VOGN0, c),
        "dense_covariance": lambda c: vogn.dense_covariance(_VOGN0, c),
    },
    vadam.VadamConfig: {
        "step": lambda c: vadam.step(_VADAM0, BATCH, EPS, c, MODEL),
        "sample": lambda c: vadam.sample(_VADAM0, EPS, c),
        "prec_diag": lambda c: vadam.prec_diag(_VADAM0, c),
    },
    noise_gamma.NoiseGammaConfig: {
        "step": lambda c: noise_gamma.step(noise_gamma.init(), 0.5, c),
        "objective": lambda c: noise_gamma.objective(np.zeros(2), 0.5, c),
        "objective_grad": lambda c: noise_gamma.objective_grad(np.zeros(2), 0.5, c),
    },
    noisy_adam.NoisyAdamConfig: {
        "step": lambda c: noisy_adam.step(_NOISY0, BATCH, EPS, c, MODEL),
        "sample": lambda c: noisy_adam.sample(_NOISY0, EPS, c),
        "prec_diag": lambda c: noisy_adam.prec_diag(_NOISY0, c),
    },
    bbb.BBBConfig: {"step": lambda c: bbb.step(_BBB0, BATCH, EPS, c, MODEL)},
    mc_dropout.MCDropoutConfig: {
        "step": lambda c: mc_dropout.step(_MCD0, BATCH, MASKS, c, NET),
        "scale": lambda c: mc_dropout.scale(c),
        "prior_precision": lambda c: mc_dropout.prior_precision(c, NET),
        "gal_weight_decay": lambda c: mc_dropout.gal_weight_decay(c),
        "predict_samples": lambda c: mc_dropout.predict_samples(_MCD0, X[:M], [MASKS], c, NET),
    },
    adam.AdamConfig: {
        "step": lambda c: adam.step(_MAP0, BATCH, c, MODEL, N, 0.5),
        "adam_update": lambda c: adam.adam_update(np.ones(D), adam.adam_init(D), c),
    },
    adam.MAPConfig: {
        "driver.run": lambda c: driver.run(_MAP0, c, MODEL, X, Y, rng=np.random.default_rng(0),
                                           epochs=1, M=M),
    },
    laplace.LaplaceConfig: {
        "fit": lambda c: laplace.fit(MODEL, np.zeros(D), X, Y, c),
        "log_marginal_likelihood": lambda c: laplace.log_marginal_likelihood(MODEL, _LAP0, X, Y, c),
    },
    riemannian_laplace.RiemannianLaplaceConfig: {
        "exp_map": lambda c: riemannian_laplace.exp_map(np.zeros(D), EPS[:, 0].copy(), _RL_GRAD,
                                                        _RL_HVP, c),
        "sample": lambda c: riemannian_laplace.sample(np.zeros(D), EPS, _RL_GRAD, _RL_HVP, c),
    },
    noisy_kfac.NoisyKFACConfig: {
        "step": lambda c: noisy_kfac.step(_NKFAC0, (X[:M], Y[:M]), np.ones((NET.D, 1)), c, NET),
        "sample": lambda c: noisy_kfac.sample(_NKFAC0, np.ones((NET.D, 1)), c, NET),
        "dense_covariance": lambda c: noisy_kfac.dense_covariance(_NKFAC0, c, NET),
        "gamma_in": lambda c: noisy_kfac.gamma_in(c),
    },
    swag.SGDConfig: {
        "sgd_step": lambda c: swag.sgd_step(_SGD0, BATCH, None, c, MODEL),
        "sgd_update": lambda c: swag.sgd_update(_SGD0, np.ones(D), c),
        "driver.run": lambda c: driver.run(_SGD0, c, MODEL, X, Y, rng=np.random.default_rng(0),
                                           epochs=1, M=M),
    },
    swag.SWAGConfig: {
        "collect": lambda c: swag.collect(_SWAG0, X[2], c),
        "diag_variance": lambda c: swag.diag_variance(_SWAG0, c),
        "sample": lambda c: swag.sample(_SWAG0, np.ones((P, 2)), np.ones((2, 2)), c),
        "dense_covariance": lambda c: swag.dense_covariance(_SWAG0, c),
        "log_density": lambda c: swag.log_density(_SWAG0, X[2], c),
    },
}

_NOT_FLOAT = {"int", "str", "bool"}


def _float_fields(cls, base, prefix=""):
    """(dotted path, annotation) of every field that may hold a float; nested configs recursed."""
    out = []
    for name in cls._fields:
        ann = cls.__annotations__[name]  # a str or ForwardRef under `from __future__ import annotations`
        ann = getattr(ann, "__forward_arg__", ann)
        ann = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
        value = getattr(base, name)
        if hasattr(value, "_fields"):
            out += _float_fields(type(value), value, f"{prefix}{name}.")
        elif ann not in _NOT_FLOAT:
            out.append((f"{prefix}{name}", ann))
    return out


def _replace(cfg, path, value):
    head, _, rest = path.partition(".")
    if rest:
        return cfg._replace(**{head: _replace(getattr(cfg, head), rest, value)})
    return cfg._replace(**{head: value})


def _bad_values(ann):
    """NaN, +inf, -inf; for fields that may hold an array, also (D,) arrays holding them."""
    values = [("nan", NAN), ("inf", INF), ("-inf", -INF), ("np.nan", np.float64(NAN))]
    if ann != "float":
        for label, v in (("nan", NAN), ("inf", INF)):
            a = np.ones(D)
            a[1] = v
            values.append((f"array-{label}", a))
    return values


def _cases():
    cases = []
    for cls, base in BASE.items():
        for path, ann in _float_fields(cls, base):
            for vlabel, value in _bad_values(ann):
                for cname in CONSUMERS[cls]:
                    cases.append(pytest.param(cls, path, value, cname,
                                              id=f"{cls.__name__}.{path}={vlabel}-{cname}"))
    return cases


def test_every_config_is_covered():
    """Each Config class of refbayes.methods has a valid baseline and its consumers listed here,
    and each has at least one float field (else the introspection below would test nothing)."""
    classes = set(_config_classes().values())
    assert classes, "no Config classes found"
    assert classes == set(BASE), f"Config classes without a baseline here: {classes ^ set(BASE)}"
    assert set(CONSUMERS) == set(BASE)
    for cls, base in BASE.items():
        assert _float_fields(cls, base), cls.__name__


@pytest.mark.parametrize("cls, cname", [(cls, c) for cls in CONSUMERS for c in CONSUMERS[cls]],
                         ids=lambda x: getattr(x, "__name__", x))
def test_baselines_are_valid(cls, cname):
    """The unmodified baseline runs through every consumer: the failures below come from the
    one field that was changed."""
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        CONSUMERS[cls][cname](BASE[cls])


@pytest.mark.parametrize("cls, path, value, cname", _cases())
def test_non_finite_hyperparameter_is_rejected(cls, path, value, cname):
    """NaN, +inf, -inf (scalars, and arrays where the field may be an array) raise ValueError
    naming ``cfg.<field>`` at every public function that consumes the Config."""
    cfg = _replace(BASE[cls], path, value)
    with pytest.raises(ValueError) as err:
        CONSUMERS[cls][cname](cfg)
    msg = str(err.value)
    assert f"cfg.{path}" in msg, msg


# ----------------------------------------------------------------------------- float arguments

# (module, function or class, argument) -> a call with that argument set to v
TINY = tiny_cnn("gaussian", n_out=1)  # its spec, for CNN's own noise_precision
FLOAT_ARGS = {
    ("refbayes.methods.driver", "draw_masks", "p"):
        lambda v: driver.draw_masks(np.random.default_rng(0), NET, M, v),
    ("refbayes.methods.exact_vi", "fit_full", "tol"):
        lambda v: exact_vi.fit_full(XD, Y, np.ones(D), tol=v),
    ("refbayes.methods.exact_vi", "fit_meanfield", "tol"):
        lambda v: exact_vi.fit_meanfield(XD, Y, np.ones(D), tol=v),
    ("refbayes.methods.exact_vi", "fit_full", "noise_precision"):
        lambda v: exact_vi.fit_full(XD, Y_REAL, np.ones(D), likelihood="gaussian",
                                    noise_precision=v),
    ("refbayes.methods.exact_vi", "fit_meanfield", "noise_precision"):
        lambda v: exact_vi.fit_meanfield(XD, Y_REAL, np.ones(D), likelihood="gaussian",
                                         noise_precision=v),
    ("refbayes.methods.exact_vi", "elbo", "noise_precision"):
        lambda v: exact_vi.elbo(XD, Y_REAL, np.ones(D), np.zeros(D), np.eye(D),
                                likelihood="gaussian", noise_precision=v),
    ("refbayes.methods.exact_vi", "gaussian_expectations", "noise_precision"):
        lambda v: exact_vi.gaussian_expectations(np.zeros(3), np.ones(3), np.zeros(3), v),
    ("refbayes.methods.exact_vi", "gh_nodes", "v_max"): lambda v: exact_vi.gh_nodes(v),
    ("refbayes.methods.mc_dropout", "predictive_log_likelihood", "noise_precision"):
        lambda v: mc_dropout.predictive_log_likelihood(np.zeros((2, 3)), np.zeros(3), v),
    ("refbayes.methods.vadam", "vprop_config", "alpha"):
        lambda v: vadam.step(_VADAM0, BATCH, EPS, vadam.vprop_config(N, 1.0, alpha=v), MODEL),
    ("refbayes.methods.vadam", "vprop_config", "beta2"):
        lambda v: vadam.step(_VADAM0, BATCH, EPS, vadam.vprop_config(N, 1.0, beta2=v), MODEL),
    ("refbayes.linalg.kron", "solve", "damping"):
        lambda v: kron.solve(np.eye(2), np.eye(3), np.ones((2, 3)), damping=v),
    ("refbayes.linalg.kron", "logdet", "damping"):
        lambda v: kron.logdet(np.eye(2), np.eye(3), damping=v),
    ("refbayes.linalg.kron", "solve_factored", "gamma"):
        lambda v: kron.solve_factored(np.eye(2), np.eye(3), np.ones((2, 3)), v),
    ("refbayes.linalg.kron", "damped_eigh", "damping"):
        lambda v: kron.damped_eigh(np.eye(2), np.eye(3), damping=v),
    ("refbayes.methods.laplace", "optimize_prior_precision", "gtol"):
        lambda v: laplace.optimize_prior_precision(MODEL, _LAP0, X, Y, laplace.LaplaceConfig(1.0),
                                                   gtol=v),
    ("refbayes.methods.laplace", "optimize_prior_precision", "init_prior_prec"):
        lambda v: laplace.optimize_prior_precision(MODEL, _LAP0, X, Y, laplace.LaplaceConfig(1.0),
                                                   method="adam", n_steps=1, init_prior_prec=v),
    ("refbayes.methods.laplace", "optimize_prior_precision", "lr"):
        lambda v: laplace.optimize_prior_precision(MODEL, _LAP0, X, Y, laplace.LaplaceConfig(1.0),
                                                   method="adam", n_steps=1, lr=v),
    ("refbayes.methods.swag", "swa_learning_rate", "alpha_init"):
        lambda v: swag.swa_learning_rate(3, alpha_init=v, alpha_swa=0.1, swa_start=4),
    ("refbayes.methods.swag", "swa_learning_rate", "alpha_swa"):
        lambda v: swag.swa_learning_rate(3, alpha_init=1.0, alpha_swa=v, swa_start=4),
    ("refbayes.methods.swag", "swa_learning_rate", "swa_start"):
        lambda v: swag.swa_learning_rate(3, alpha_init=1.0, alpha_swa=0.1, swa_start=v),
    ("refbayes.methods.ktied", "init", "sigma0"):
        lambda v: ktied.init(np.zeros(NET.D), NET, 2, v, np.zeros(ktied.layout(NET, 2).P)),
    ("refbayes.methods.ktied", "init", "jitter"):
        lambda v: ktied.init(np.zeros(NET.D), NET, 2, 0.1, np.zeros(ktied.layout(NET, 2).P), v),
    ("refbayes.methods.noise_gamma", "init", "a"): lambda v: noise_gamma.init(v, 6.0),
    ("refbayes.methods.noise_gamma", "init", "b"): lambda v: noise_gamma.init(6.0, v),
    ("refbayes.methods.noise_gamma", "objective", "r2"):
        lambda v: noise_gamma.objective(np.zeros(2), v, noise_gamma.NoiseGammaConfig(N)),
    ("refbayes.methods.noise_gamma", "objective_grad", "r2"):
        lambda v: noise_gamma.objective_grad(np.zeros(2), v, noise_gamma.NoiseGammaConfig(N)),
    ("refbayes.methods.noise_gamma", "step", "r2"):
        lambda v: noise_gamma.step(noise_gamma.init(), v, noise_gamma.NoiseGammaConfig(N)),
    ("refbayes.models.likelihoods", "Gaussian", "noise_precision"): lambda v: Gaussian(v),
    ("refbayes.models.likelihoods", "make_likelihood", "noise_precision"):
        lambda v: make_likelihood("gaussian", v),
    ("refbayes.models.likelihoods", "make_likelihood (bernoulli)", "noise_precision"):
        lambda v: make_likelihood("bernoulli", v),
    ("refbayes.models.mlp", "MLP", "noise_precision"):
        lambda v: MLP([P, 4, 1], likelihood="gaussian", noise_precision=v),
    ("refbayes.models.mlp", "MLP (categorical)", "noise_precision"):
        lambda v: MLP([P, 4, 3], likelihood="categorical", noise_precision=v),
    ("refbayes.models.conv", "CNN", "noise_precision"):
        lambda v: CNN(TINY.input_shape, TINY.layers, "gaussian", noise_precision=v),
    ("refbayes.models.conv", "tiny_cnn", "noise_precision"):
        lambda v: tiny_cnn("gaussian", n_out=1, noise_precision=v),
    ("refbayes.models.dropout", "masked_forward", "scale"):
        lambda v: masked.masked_forward(NET, THETA, X[:M], MASKS, v),
}


def _public_float_arguments():
    """(module, name, argument) of every public function / class of methods, linalg and models
    whose argument has a float default or a ``float`` annotation (Config fields excluded)."""
    found = set()
    for pkg in (refbayes.methods, refbayes.linalg, refbayes.models):
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for name in getattr(mod, "__all__", []):
                obj = getattr(mod, name)
                if inspect.isclass(obj):
                    if hasattr(obj, "_fields"):
                        continue
                    obj = obj.__init__ if "__init__" in vars(obj) else None
                if not callable(obj):
                    continue
                try:
                    params = inspect.signature(obj).parameters.values()
                except (TypeError, ValueError):
                    continue
                for p in params:
                    if ((isinstance(p.default, float) or p.annotation in ("float", float))
                            and not isinstance(p.default, bool)):
                        found.add((mod.__name__, name, p.name))
    return found


def test_every_float_argument_is_listed():
    listed = {(m, f.split(" ")[0], a) for m, f, a in FLOAT_ARGS}
    missing = _public_float_arguments() - listed
    assert not missing, f"float arguments without a NaN/inf test here: {sorted(missing)}"


@pytest.mark.parametrize("key", list(FLOAT_ARGS), ids=lambda k: f"{k[1]}.{k[2]}")
@pytest.mark.parametrize("value", [NAN, INF, -INF], ids=["nan", "inf", "-inf"])
def test_non_finite_float_argument_is_rejected(key, value):
    with pytest.raises(ValueError) as err:
        FLOAT_ARGS[key](value)
    assert re.search(rf"(^|[^\w]){key[2]}:", str(err.value)), str(err.value)


@pytest.mark.parametrize("key", list(FLOAT_ARGS), ids=lambda k: f"{k[1]}.{k[2]}")
def test_float_argument_baseline_is_valid(key):
    """A valid value passes (so the rejections above come from the value)."""
    good = {"p": 0.1, "tol": 1e-6, "v_max": 1.0, "damping": 0.5, "gamma": 0.5, "scale": 1.25,
            "alpha": 1e-3, "beta2": 0.9, "noise_precision": 2.0, "gtol": 1e-8,
            "init_prior_prec": 1.0, "lr": 0.1, "alpha_init": 1.0, "alpha_swa": 0.1,
            "swa_start": 4.0, "sigma0": 0.1, "jitter": 0.1, "a": 2.0, "b": 3.0,
            "r2": 0.5}[key[2]]
    FLOAT_ARGS[key](good)


# ----------------------------------------------------------------------------- symmetric matrices

def _asym(D_=D):
    A = np.eye(D_) * 2.0
    A[0, 1] = 0.5  # upper triangle only: a Cholesky routine reading the lower one never sees it
    return A


def test_init_full_rejects_a_non_symmetric_precision():
    with pytest.raises(ValueError, match=r"Sigma_inv: expected a symmetric matrix, got "
                                         r"max\|M - M\^T\| = 5.000e-01"):
        ngvi.init_full(np.zeros(D), _asym())


@pytest.mark.parametrize("fn", [
    lambda s: ngvi.dense_covariance(s),
    lambda s: ngvi.sample_full(s, EPS),
    lambda s: ngvi.step_full(s, BATCH, EPS, BASE[ngvi.NGVIConfig], MODEL),
], ids=["dense_covariance", "sample_full", "step_full"])
def test_full_state_rejects_a_non_symmetric_precision(fn):
    """Before: dense_covariance of such a state returned the inverse of its lower triangle."""
    state = _FULL0._replace(Sigma_inv=_asym())
    with pytest.raises(ValueError, match=r"state.Sigma_inv: expected a symmetric matrix"):
        fn(state)


@pytest.mark.parametrize("fn", [
    lambda S: exact_vi.elbo(XD, Y, np.ones(D), np.zeros(D), S),
    lambda S: exact_vi.elbo_grad(XD, Y, np.ones(D), np.zeros(D), S),
], ids=["elbo", "elbo_grad"])
def test_exact_vi_rejects_a_non_symmetric_covariance(fn):
    with pytest.raises(ValueError, match=r"Sigma: expected a symmetric matrix"):
        fn(_asym() * 0.1)


# ----------------------------------------------------------------------------- subnormal diagonals

@pytest.mark.parametrize("fn, name", [
    (lambda d: slang.init(np.zeros(D), np.zeros((D, 1)), d), "d"),
    (lambda d: slang.step(_SLANG0._replace(d=d), BATCH, EPS, BASE[slang.SLANGConfig], MODEL),
     "state.d"),
    (lambda d: slang.dense_covariance(_SLANG0._replace(d=d)), "state.d"),
    (lambda d: ngvi.init_meanfield(np.zeros(D), d), "prec_diag"),
    (lambda d: ngvi.step_meanfield(_MF0._replace(prec_diag=d), BATCH, EPS,
                                   BASE[ngvi.NGVIConfig], MODEL), "state.prec_diag"),
    (lambda d: ngvi.dense_covariance_meanfield(_MF0._replace(prec_diag=d)), "state.prec_diag"),
    (lambda d: exact_vi.elbo_meanfield(XD, Y, np.ones(D), np.zeros(D), d), "var"),
], ids=["slang.init", "slang.step", "slang.dense_covariance", "ngvi.init_meanfield",
        "ngvi.step_meanfield", "ngvi.dense_covariance_meanfield", "exact_vi.elbo_meanfield"])
def test_subnormal_precision_diagonal_is_rejected(fn, name):
    """A diagonal precision entry below the smallest normal float has an infinite reciprocal."""
    d = np.ones(D)
    d[2] = 1e-320
    with pytest.raises(ValueError, match=rf"(^|[^\w]){re.escape(name)}: expected entries >= "
                                         r".*smallest normal float64"):
        fn(d)


def test_slang_state_with_overflowing_U_is_rejected():
    U = np.full((D, 1), 1e160)
    with pytest.raises(ValueError, match=r"state.U: expected .*U U\^T"):
        slang.step(_SLANG0._replace(U=U), BATCH, EPS, BASE[slang.SLANGConfig], MODEL)
    with pytest.raises(ValueError, match=r"(^|[^\w])U: expected .*U U\^T"):
        slang.init(np.zeros(D), U, np.ones(D))


# ----------------------------------------------------------------------------- step sizes (ngvi.12)

def _schedule(t, a, decay):
    """(ngvi.12), the closed form the Config comments state: a / (1 + (t + 1)^decay) at
    state.t = t for decay > 0, the constant a for decay = 0."""
    return a if decay == 0 else a / (1.0 + (t + 1) ** decay)


@pytest.mark.parametrize("decay", [0.51, 1.0, 0.0])
@pytest.mark.parametrize("t", [0, 1, 7])
@pytest.mark.parametrize("family", ["slang", "full", "meanfield"])
def test_step_sizes_follow_the_stated_schedule(family, t, decay):
    """Info.alpha_t and Info.beta_t equal the closed form, and the update uses them:
    mu_{t+1} = mu_t - alpha_t Delta_mu and the precision moves by beta_t."""
    alpha, beta = 0.3, 0.2
    lam = np.full(D, 0.7)
    a_t, b_t = _schedule(t, alpha, decay), _schedule(t, beta, decay)
    if family == "slang":
        cfg = slang.SLANGConfig(N, lam, L=1, alpha=alpha, beta=beta, decay=decay)
        state = _SLANG0._replace(t=t)
        new, info = slang.step(state, BATCH, EPS, cfg, MODEL)
        d = (1 - b_t) * state.d + info.Delta_d + b_t * lam                     # (slang.4)
        assert_close(new.d, d, EXACT_F64, "d uses beta_t")
    else:
        cfg = ngvi.NGVIConfig(N, lam, alpha=alpha, beta=beta, decay=decay)
        if family == "full":
            state = _FULL0._replace(t=t)
            new, info = ngvi.step_full(state, BATCH, EPS, cfg, MODEL)
            P_new = (1 - b_t) * state.Sigma_inv + b_t * (info.C_hat + np.diag(lam))  # (ngvi.4)
            assert_close(new.Sigma_inv, P_new, EXACT_F64, "Sigma_inv uses beta_t")
        else:
            state = _MF0._replace(t=t)
            new, info = ngvi.step_meanfield(state, BATCH, EPS, cfg, MODEL)
            p_new = (1 - b_t) * state.prec_diag + b_t * (info.c_hat + lam)   # (ngvi.15)
            assert_close(new.prec_diag, p_new, EXACT_F64, "prec_diag uses beta_t")
    assert math.isclose(info.alpha_t, a_t, rel_tol=EXACT_F64, abs_tol=0.0), (info.alpha_t, a_t)
    assert math.isclose(info.beta_t, b_t, rel_tol=EXACT_F64, abs_tol=0.0), (info.beta_t, b_t)
    assert_close(new.mu, state.mu - a_t * info.Delta_mu, EXACT_F64, "mu uses alpha_t")
    if decay > 0:  # the formula the comments used to state, alpha / (1 + t)^decay, is not it
        assert not math.isclose(info.alpha_t, alpha / (1 + t) ** decay, rel_tol=1e-3)
