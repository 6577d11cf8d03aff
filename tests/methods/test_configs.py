"""Method configs are validated when they are made (issue 35, item 4): ``XConfig(...)`` and
unpickling raise the ValueError of the module's own config check, word for word; ``_replace``
and ``_make`` are not re-validated (so the consumers keep checking); the classes stay plain
NamedTuples to ``isinstance``, ``_asdict``, pickle and ``field_tags``."""
import copy
import inspect
import math
import pickle
import warnings

import numpy as np
import pytest

import refbayes
from refbayes.methods import (
    adam,
    bbb,
    ktied,
    laplace,
    mc_dropout,
    ngvi,
    noise_gamma,
    noisy_adam,
    noisy_kfac,
    riemannian_laplace,
    slang,
    swag,
    vogn,
)
from refbayes.tracing.tags import field_tags

NAN = float("nan")

# (class, valid positional args, the module's check as consumers call it, {field: bad value})
CONFIGS = [
    (swag.SGDConfig, (10,), swag._check_sgd_config,
     {"N": 0, "lam": NAN, "alpha": NAN, "momentum": 1.0}),
    (swag.SWAGConfig, (), swag._check_config, {"K": 0, "scale": 0.0, "var_clamp": -1.0}),
    (adam.AdamConfig, (), adam.check_adam_config, {"alpha": 0.0, "beta1": 1.0, "eps_adam": NAN}),
    (adam.MAPConfig, (10,), adam.check_map_config,
     {"N": 0, "lam": -1.0, "adam": (1e-3, 0.9, 0.999, 1e-8)}),
    (bbb.BBBConfig, (10, 1.0), bbb._check_cfg, {"N": 1.5, "lam": NAN, "kl_weight": -1.0}),
    (laplace.LaplaceConfig, (), laplace._check_cfg,
     {"prior_precision": 0.0, "structure": "lowrank", "curvature": "fisher",
      "subset": "first_layer"}),
    (mc_dropout.MCDropoutConfig, (10,), mc_dropout._check_cfg, {"p": 1.0, "inverted": 1}),
    (ngvi.NGVIConfig, (10, np.ones(3)), ngvi._check_cfg,
     {"lam": np.array([1.0, NAN]), "beta": 0.0, "curvature": "fisher"}),
    (noise_gamma.NoiseGammaConfig, (10,), noise_gamma._check_cfg, {"a0": 0.0, "beta2": 1.0}),
    (noisy_adam.NoisyAdamConfig, (10, 1.0), noisy_adam._check_cfg,
     {"prior_precision": -1.0, "gamma_ex": -1.0, "squares": "weird"}),
    (noisy_kfac.NoisyKFACConfig, (10,), noisy_kfac._check_config,
     {"damping": "weird", "T_inv": 0, "kl_clip": 0.0}),
    (riemannian_laplace.RiemannianLaplaceConfig, (), riemannian_laplace._check_cfg,
     {"method": "euler", "rtol": 1.0}),
    (slang.SLANGConfig, (10, np.ones(3), 1), slang._check_cfg,
     {"L": 0, "eig": "weird", "n_iter": -1}),
    (vogn.VOGNConfig, (10, 1.0), vogn._scales, {"delta": 0.0, "beta2": 0.0, "rho": NAN}),
]
IDS = [c[0].__name__ for c in CONFIGS]
BAD = [(cls, args, check, field, value)
       for cls, args, check, bad in CONFIGS for field, value in bad.items()]
BAD_IDS = [f"{cls.__name__}.{field}" for cls, _, _, field, _ in BAD]


def _message(f):
    with pytest.raises(ValueError) as e:
        f()
    return str(e.value)


@pytest.mark.parametrize("f, match", [
    (lambda: swag.SGDConfig(N=10, lam=1.0, alpha=NAN), r"cfg\.alpha: expected > 0 everywhere"),
    (lambda: swag.SWAGConfig(K=0), r"cfg\.K: expected an integer in \[1, inf\), got 0"),
    (lambda: laplace.LaplaceConfig(curvature="fisher"), r"cfg\.curvature: expected one of"),
    (lambda: noisy_kfac.NoisyKFACConfig(10, damping="weird"), r"cfg\.damping: expected one of"),
    (lambda: ktied.KTiedConfig(10, lam=NAN), r"cfg\.lam: expected a finite prior precision"),
], ids=["sgd-alpha", "swag-K", "laplace-curvature", "nkfac-damping", "ktied-lam"])
def test_the_issues_configs_raise_at_construction(f, match):
    with pytest.raises(ValueError, match=match):
        f()


@pytest.mark.parametrize("cls, args, check, field, value", BAD, ids=BAD_IDS)
def test_construction_raises_the_consumers_message(cls, args, check, field, value):
    good = cls(*args)
    made = _message(lambda: cls(**{**dict(zip(cls._fields, args)), field: value}))
    # the consumers' check on the same values (built by _replace, which does not validate)
    assert made == _message(lambda: check(good._replace(**{field: value})))


@pytest.mark.parametrize("cls, args, check, bad", CONFIGS, ids=IDS)
def test_a_valid_config_is_a_plain_namedtuple(cls, args, check, bad):
    cfg = cls(*args)
    assert isinstance(cfg, cls) and isinstance(cfg, tuple) and type(cfg) is cls
    assert cls(**dict(zip(cls._fields, args))) == cfg  # keywords, defaults
    assert list(inspect.signature(cls).parameters) == list(cls._fields)
    assert list(cfg._asdict()) == list(cls._fields)
    check(cfg)
    for clone in (pickle.loads(pickle.dumps(cfg)), copy.copy(cfg), copy.deepcopy(cfg)):
        assert type(clone) is cls
        for a, b in zip(clone, cfg):
            assert np.array_equal(a, b) if hasattr(a, "shape") else a == b
    # the field comments still sit on the class field_tags reads (the traces' manifests)
    assert set(field_tags(cls)) == set(cls._fields)
    assert "_replace" in cls.__doc__ and "Construction" in cls.__doc__


@pytest.mark.parametrize("cls, args, check, field, value", BAD, ids=BAD_IDS)
def test_replace_and_make_are_not_revalidated_so_consumers_check(cls, args, check, field,
                                                                 value):
    good = cls(*args)
    bad = good._replace(**{field: value})
    assert type(bad) is cls
    assert type(cls._make(tuple(bad))) is cls
    with pytest.raises(ValueError):
        check(bad)
    # unpickling calls cls(...): an invalid cfg cannot cross to a Dask worker unnoticed
    with pytest.raises(ValueError):
        pickle.loads(pickle.dumps(bad))


def test_construction_checks_only_what_needs_no_state():
    # lam's length and dtype need D and the state's dtype: checked by the consumers
    swag.SGDConfig(10, lam=np.ones(3, dtype=np.float32))
    ngvi.NGVIConfig(10, np.ones(2))
    slang.SLANGConfig(10, np.ones(2), 5)  # L <= D is checked with the state
    laplace.LaplaceConfig(np.ones(7))
    with pytest.raises(ValueError, match=r"cfg\.lam: expected shape \(\*\), got \(2, 2\)"):
        ngvi.NGVIConfig(10, np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"cfg\.prior_precision: expected > 0 everywhere"):
        laplace.LaplaceConfig(np.array([1.0, -1.0]))


def test_unchecked_skips_only_the_value_scans_at_construction():
    with refbayes.unchecked():
        ngvi.NGVIConfig(10, np.array([1.0, math.nan]))  # a value scan: skipped
        with pytest.raises(ValueError, match=r"cfg\.alpha"):
            swag.SGDConfig(10, alpha=NAN)  # a scalar check: always


def test_ktied_layout_warns_when_k_exceeds_a_layers_rank():
    # issue 35, item 4: ktied.layout(model, 100) on [2, 3, 3] gave P = 1005 without a word
    from refbayes.methods import ktied
    from refbayes.models import MLP

    model = MLP([2, 3, 3])
    kept = (2 + 3) * 2 + 3 + (3 + 3) * 3 + 3  # (ktied.10) with k = (2, 3)
    with pytest.warns(UserWarning, match=rf"layer 0 \(2 x 3\): 100 > 2; layer 1 \(3 x 3\): 100 > 3;"
                                         rf".*P = 1106, against {kept} with k = \(2, 3\)"):
        lay = ktied.layout(model, 100)
    assert lay.P == 1106  # kept as given, not clamped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ktied.layout(model, (2, 3)).P == kept


def test_ktied_init_warns_once_for_the_caller_and_step_does_not():
    from refbayes.methods import ktied
    from refbayes.models import MLP

    model = MLP([2, 3, 3])
    rng = np.random.default_rng(0)
    lay = ktied._layout(model, 3)
    with pytest.warns(UserWarning, match=r"layer 0 \(2 x 3\): 3 > 2") as rec:
        state = ktied.init(rng.standard_normal(lay.D), model, 3, sigma0=0.1,
                           xi=rng.standard_normal(lay.P))
        assert ktied.n_variational_params(model, 3) == lay.D + lay.P
    assert [r.filename for r in rec] == [__file__, __file__]  # stacklevel: the caller's lines
    X, y = rng.standard_normal((4, 2)), rng.standard_normal((4, 3))  # gaussian, 3 outputs
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ktied.step(state, (X, y), rng.standard_normal((lay.D, 1)),
                   ktied.KTiedConfig(N=4, lam=1.0), model)
