"""Running a traced method: the model spec, flattening NamedTuples into named arrays, and K
chained steps by the draw rule of ``derivations/tracing.md`` ("Draws of chained steps").
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import numpy as np

from refbayes.methods import Batch
from refbayes.methods.driver import epoch_batches
from refbayes.models import (CNN, MLP, Activation, AvgPool2d, Conv2d, Dense, Flatten,
                             LogisticRegression, MaxPool2d, SoftmaxRegression)
from refbayes.tracing.tags import field_tags

__all__ = ["CNN_LAYERS", "Chain", "arrays_of", "cfg_arrays", "drawn_chain", "fit_arrays",
           "layer_from_spec", "layer_spec", "model_from_spec", "model_spec", "run_chain",
           "scalars_of"]


# The layer records a CNN spec may name, by their "type" (refbayes.models.conv).
CNN_LAYERS = {t.__name__: t for t in (Conv2d, MaxPool2d, AvgPool2d, Flatten, Dense, Activation)}
CNN_SPEC_KEYS = ("input_shape", "layers", "likelihood", "noise_precision")


def _plain(value):
    """A layer field as JSON data: tuples as lists."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def layer_spec(layer) -> dict:
    """Describe one CNN layer record as plain data: its type name and every field.

    Parameters
    ----------
    layer : Conv2d, MaxPool2d, AvgPool2d, Flatten, Dense or Activation
        A layer record of refbayes.models.conv (a dataclass).

    Returns
    -------
    dict
        ``{"type": <class name>, <field>: <value>, ...}``, pairs as lists, e.g.
        ``{"type": "Conv2d", "c_in": 1, "c_out": 2, "kernel": [3, 3], "stride": [1, 1],
        "padding": [0, 0], "bias": True}``; ``layer_from_spec`` rebuilds the record.

    Raises
    ------
    ValueError
        If layer is not one of those records.
    """
    if type(layer).__name__ not in CNN_LAYERS or not dataclasses.is_dataclass(layer):
        raise ValueError(f"layer: expected one of {', '.join(CNN_LAYERS)}, got {layer!r:.80}")
    return {"type": type(layer).__name__,
            **{f.name: _plain(getattr(layer, f.name)) for f in dataclasses.fields(layer)}}


def layer_from_spec(spec, where: str = "layer"):
    """Rebuild one CNN layer record from ``layer_spec``'s plain data.

    Parameters
    ----------
    spec : dict
        ``{"type": ..., <field>: <value>, ...}``; a field left out takes the record's default.
    where : str, default "layer"
        How the messages name the layer (``model_from_spec``: "model: layers[k]").

    Returns
    -------
    Conv2d, MaxPool2d, AvgPool2d, Flatten, Dense or Activation
        The record.

    Raises
    ------
    ValueError
        If spec is not a dict, names no known type, holds a field the type does not have, or a
        value the record refuses (the record's own message, prefixed with ``where``).
    """
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a dict with a 'type' and the layer's fields, got "
                         f"{spec!r:.80}")
    kind = spec.get("type")
    if kind not in CNN_LAYERS:
        raise ValueError(f"{where}: type: expected one of {', '.join(CNN_LAYERS)}, got {kind!r}")
    cls = CNN_LAYERS[kind]
    names = [f.name for f in dataclasses.fields(cls)]
    args = {k: v for k, v in spec.items() if k != "type"}
    unknown = sorted(set(args) - set(names))
    if unknown:
        raise ValueError(f"{where}: {kind} has the fields {', '.join(names) or 'none'}, got "
                         f"{', '.join(unknown)}")
    try:
        return cls(**args)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where} ({kind}): {err}") from None


def model_spec(model) -> dict:
    """Describe a model for a manifest: class, repr, D, and what rebuilds it.

    An MLP, LogisticRegression or SoftmaxRegression: its sizes, bias and constructor ``args``;
    a CNN: its ``input_shape``, its ``layers`` as plain data (``layer_spec``), ``likelihood`` and
    ``noise_precision`` (no sizes, no bias: its layers say them).

    Parameters
    ----------
    model : FlatModel or CNN
        An MLP, LogisticRegression, SoftmaxRegression or CNN (other FlatModels get no ``args``).

    Returns
    -------
    dict
        The spec; ``model_from_spec`` rebuilds the model from it.
    """
    if isinstance(model, CNN):
        return {"class": "CNN", "repr": repr(model), "D": int(model.D),
                "input_shape": [int(n) for n in model.input_shape],
                "layers": [layer_spec(layer) for layer in model.layers],
                "likelihood": model.likelihood.name,
                "noise_precision": float(getattr(model.likelihood, "noise_precision", 1.0))}
    spec = {"class": type(model).__name__, "repr": repr(model), "D": int(model.D),
            "sizes": [int(n) for n in model.sizes], "bias": bool(model.bias)}
    if isinstance(model, MLP):
        spec["args"] = {"sizes": spec["sizes"], "activation": model.activation,
                        "likelihood": model.likelihood.name,
                        "noise_precision": float(getattr(model.likelihood, "noise_precision",
                                                         1.0))}
    elif isinstance(model, LogisticRegression):
        spec["args"] = {"n_features": spec["sizes"][0], "intercept": spec["bias"]}
    elif isinstance(model, SoftmaxRegression):
        spec["args"] = {"n_features": spec["sizes"][0], "n_classes": spec["sizes"][-1],
                        "intercept": spec["bias"]}
    return spec


def _cnn_from_spec(spec: dict):
    missing = [k for k in CNN_SPEC_KEYS if k not in spec]
    if missing:
        raise ValueError(f"model: the CNN spec lacks {', '.join(missing)} (expected "
                         f"{', '.join(CNN_SPEC_KEYS)})")
    layers = spec["layers"]
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"model: layers: expected a non-empty list of layer dicts, got "
                         f"{layers!r:.80}")
    records = [layer_from_spec(layer, f"model: layers[{k}]") for k, layer in enumerate(layers)]
    try:
        return CNN(spec["input_shape"], records, spec["likelihood"], spec["noise_precision"])
    except ValueError as err:
        raise ValueError(f"model: the CNN spec does not build: {err}") from None


def model_from_spec(spec: dict):
    """Rebuild a trace's model from its manifest spec.

    Parameters
    ----------
    spec : dict
        ``Trace.model``.

    Returns
    -------
    FlatModel or CNN
        The model, equal to the traced one.

    Raises
    ------
    ValueError
        If the spec is not a dict, names a model class that cannot be rebuilt, a CNN spec lacks a
        key or holds a bad layer (unknown type or field, a value out of range, layers that do
        not chain), or the rebuilt model's D differs.
    """
    if not isinstance(spec, dict):
        raise ValueError(f"model: expected a model spec dict, got {spec!r:.80}")
    classes = {"MLP": MLP, "LogisticRegression": LogisticRegression,
               "SoftmaxRegression": SoftmaxRegression}
    if spec.get("class") == "CNN":
        model = _cnn_from_spec(spec)
    elif spec.get("class") not in classes or "args" not in spec:
        why = "no args" if spec.get("class") in classes else f"class {spec.get('class')!r}"
        raise ValueError(f"model: cannot rebuild {spec.get('repr', spec)!r} ({why}; known: "
                         f"{', '.join([*classes, 'CNN'])})")
    else:
        model = classes[spec["class"]](**spec["args"])
    if model.D != spec.get("D"):
        raise ValueError(f"model: rebuilt {model!r} has D = {model.D}, the trace says "
                         f"{spec.get('D')!r}")
    return model


def _is_namedtuple(v) -> bool:
    return isinstance(v, tuple) and hasattr(v, "_fields")


def _numeric(v) -> bool:
    return isinstance(v, (bool, int, float, np.ndarray, np.generic)) and \
        np.asarray(v).dtype.kind in "biuf"


def arrays_of(prefix: str, value) -> dict:
    """Flatten a NamedTuple (nested, with lists of arrays) into named numeric arrays.

    Fields that are None, strings, models or other objects are left out.

    Parameters
    ----------
    prefix : str
        Prepended to every name, e.g. 'input.state.'.
    value : NamedTuple, dict, list or tuple
        The object to flatten.

    Returns
    -------
    dict of str to numpy.ndarray
        Names 'prefix + field', 'prefix + field.sub' and 'prefix + field.i' for list items.
    """
    out = {}
    if _is_namedtuple(value):
        items = value._asdict().items()
    else:
        items = value.items() if isinstance(value, dict) else enumerate(value)
    for name, v in items:
        key = f"{prefix}{name}"
        if isinstance(v, (list, tuple)):
            out.update(arrays_of(key + ".", v))
        elif _numeric(v):
            out[key] = np.array(v)
    return out


def scalars_of(cfg, prefix: str = "") -> dict:
    """Collect a config's scalar fields (nested configs as 'adam.alpha') as JSON values.

    Parameters
    ----------
    cfg : NamedTuple
        A method's Config.
    prefix : str, default ''
        Prepended to every name.

    Returns
    -------
    dict
        Name to bool, int, float, str or None; array fields are left out (``arrays_of``).
    """
    out = {}
    for name, v in cfg._asdict().items():
        if _is_namedtuple(v):
            out.update(scalars_of(v, f"{prefix}{name}."))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{name}"] = v
        elif isinstance(v, (np.generic, np.ndarray)) and np.ndim(v) == 0:
            out[f"{prefix}{name}"] = v.item()
    return out


def cfg_arrays(cfg, prefix: str = "input.cfg.") -> dict:
    """Name every numeric field of a config 'input.cfg.<field>' (``derivations/tracing.md``).

    Scalars are 0-d arrays (a bool a 0-d bool array), nested configs 'input.cfg.adam.alpha';
    strings and None are left out (they stay in the manifest's config, ``scalars_of``).

    Parameters
    ----------
    cfg : NamedTuple
        A method's Config.
    prefix : str, default 'input.cfg.'
        Prepended to every name (a second config of a trace: 'input.cfg.sgd.').

    Returns
    -------
    dict of str to numpy.ndarray
        The numeric fields: scalars (0-d) and arrays (a (D,) prior precision, ...).
    """
    return arrays_of(prefix, cfg)


def _cast(value, dtype):
    """Cast every float array (and float scalar array) inside value to dtype; keep the rest."""
    if _is_namedtuple(value):
        return type(value)(*(_cast(v, dtype) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    return value


def _stack(per_step: list[dict]) -> dict:
    names = list(per_step[0])
    for k, d in enumerate(per_step):
        if list(d) != names:
            raise RuntimeError(f"step {k + 1} produced fields {list(d)}, step 1 {names}")
    return {n: np.stack([d[n] for d in per_step]) for n in names}


class Chain(NamedTuple):
    """What a chained trace needs: the start, the step and how one step draws.

    Attributes
    ----------
    state : NamedTuple
        The starting state.
    cfg : NamedTuple
        The config.
    model : FlatModel
        The model.
    X : numpy.ndarray
        Training inputs (N, n_in).
    y : numpy.ndarray
        Training targets.
    M : int
        Minibatch rows.
    step : callable
        ``step(state, batch, noise, cfg, model, **kwargs) -> (state, info)``.
    draws : callable
        ``draws(rng, M) -> (noise, kwargs)``: the step's noise after its minibatch.
    rng : numpy.random.Generator
        The generator the start was drawn from; step 1 continues it.
    tags : dict of str to str or None
        Tags of the Info fields (None: read from the Info class's field comments).
    first : tuple or None
        (idx, noise, kwargs) of step 1 when drawn already (the ``refbayes trace`` recipes);
        None: step 1 draws from ``rng``.
    labels : callable or None
        ``labels(rng, state, X_B, noise) -> kwargs``: inputs drawn after the noise that depend on
        the state the step starts from (Noisy K-FAC's sampled labels at its draws), merged into
        the step's kwargs for steps k + 1 >= 2 (step 1's are in ``first``); None: none.
    """
    state: Any
    cfg: Any
    model: Any
    X: Any
    y: Any
    M: int
    step: Callable
    draws: Callable
    rng: np.random.Generator | None
    tags: dict | None = None
    first: tuple | None = None
    labels: Callable | None = None


def drawn_chain(inputs, step: Callable) -> Chain:
    """Build the chain of a recipe that drew its own first step.

    Step 1 consumes ``inputs``' minibatch and eps; steps k + 1 >= 2 draw the minibatch, then eps
    of the same shape (none when ``inputs.eps`` is None).

    Parameters
    ----------
    inputs : NamedTuple
        A recipe's inputs with fields state, cfg, model, X, y, idx and eps.
    step : callable
        The method's step.

    Returns
    -------
    Chain
        Ready for ``run_chain``.
    """
    eps = inputs.eps

    def draws(rng, M):
        return (None if eps is None else rng.standard_normal(eps.shape)), {}

    return Chain(inputs.state, inputs.cfg, inputs.model, inputs.X, inputs.y, len(inputs.idx),
                 step, draws, None, first=(inputs.idx, eps, {}))


def _noise_arrays(noise, kwargs) -> dict:
    out = {}
    if isinstance(noise, list):
        out.update({f"input.masks.{l}": np.asarray(z) for l, z in enumerate(noise)})
    elif noise is not None:
        out["input.eps"] = np.asarray(noise)
    out.update({f"input.{k}": np.asarray(v) for k, v in kwargs.items()})
    return out


def run_chain(chain: Chain, seed: int, steps: int, dtype) -> tuple:
    """Take ``steps`` chained steps by the draw rule of ``derivations/tracing.md``; collect them.

    Parameters
    ----------
    chain : Chain
        The start, step and draw rule, in float64.
    seed : int
        The trace's seed (steps k + 1 >= 2 draw from ``default_rng([seed, k])``).
    steps : int
        K >= 1.
    dtype : numpy dtype
        Float64, or float32: the start, the data and the draws (made in float64) rounded.

    Returns
    -------
    tuple
        (inputs, outputs, tags, config, model spec, per-step input names) as in ``Tracer.run``.
    """
    dtype = np.dtype(dtype)
    state = _cast(chain.state, dtype)
    cfg = _cast(chain.cfg, dtype)
    X = _cast(chain.X, dtype)
    y = _cast(chain.y, dtype) if np.asarray(chain.y).dtype.kind == "f" else chain.y
    N = X.shape[0]
    inputs = arrays_of("input.state.", state)
    inputs.update(cfg_arrays(cfg))
    step_inputs, step_outputs = [], []
    info_tags, state_tags = None, field_tags(type(state))
    for k in range(steps):
        if k == 0 and chain.first is not None:
            idx, noise, kwargs = chain.first
        else:
            rng = chain.rng if k == 0 else np.random.default_rng([seed, k])
            idx = epoch_batches(rng, N, chain.M)[0]
            noise, kwargs = chain.draws(rng, chain.M)
        noise, kwargs = _cast(noise, dtype), {n: _cast(v, dtype) for n, v in kwargs.items()}
        if chain.labels is not None and not (k == 0 and chain.first is not None):
            kwargs.update(chain.labels(rng, state, X[idx], noise))
        drawn = {"input.batch.idx": np.asarray(idx), "input.batch.X": X[idx],
                 "input.batch.y": y[idx], **_noise_arrays(noise, kwargs)}
        state, info = chain.step(state, Batch(X[idx], y[idx]), noise, cfg, chain.model, **kwargs)
        out = arrays_of("", info)
        extra = {f"state.{n}": a for n, a in arrays_of("", state).items()
                 if n.split(".")[0] not in info._fields}
        out.update(extra)
        if info_tags is None:
            info_tags = dict(chain.tags) if chain.tags is not None else field_tags(type(info))
        step_inputs.append(drawn)
        step_outputs.append(out)
    per_step = _stack(step_inputs)
    inputs.update(per_step)
    outputs = _stack(step_outputs)
    tags = {}
    for name in outputs:
        head = name.split(".")[0]
        if name.startswith("state."):
            tags[name] = state_tags.get(name.split(".")[1], "")
        else:
            tags[name] = info_tags.get(head, "")
    for name in inputs:
        if name.startswith("input.state."):
            tags[name] = state_tags.get(name.split(".")[2], "")
    return inputs, outputs, tags, scalars_of(cfg), model_spec(chain.model), set(per_step)


def fit_arrays(inputs, info, names: dict | None = None, configs: tuple = ("cfg",)) -> tuple:
    """Collect a trace taken as one fit (or one SGD run): its inputs and its Info, one step.

    The inputs are named by the rule of ``derivations/tracing.md`` ("Names"): ``method``,
    ``seed`` and ``model`` are recorded in the manifest; a config field (``configs``; the first
    is the method's own) goes to the manifest's config (``scalars_of``) and, every numeric field
    including the scalars, to ``input.cfg.<field>`` (a second config ``sgd`` to
    ``input.cfg.sgd.<field>``); ``state`` to ``input.state.<field>``; the data X, y to
    ``input.batch.X``, ``input.batch.y``: the rows ``X[idx]``, ``y[idx]`` with
    ``input.batch.idx`` when the inputs hold ``idx`` (any shape: swag's (T, M), one row per SGD
    step), else the whole set, every row of which the fit consumes; ``eps`` to ``input.eps``;
    ``names`` renames a field (e.g. swag's ``{"z1": "input.eps.z1"}``); every other numeric
    field is ``input.<field>``.

    Parameters
    ----------
    inputs : NamedTuple
        Everything the fit consumed.
    info : NamedTuple
        The fit's named intermediates; their tags are read off the class's field comments.
    names : dict of str to str, optional
        A field's array name (or prefix, for a NamedTuple field) in place of the rule's.
    configs : tuple of str, default ("cfg",)
        The config fields, the method's own first.

    Returns
    -------
    tuple
        (inputs, outputs, tags, config, model spec, per-step input names) as in ``Tracer.run``;
        each output has a leading step axis of length 1.
    """
    names = dict(names or {})
    arrays, config = {}, {}
    fields = inputs._asdict()
    for name, value in fields.items():
        if name in ("method", "seed", "model") or value is None:
            continue
        if name in configs:
            sub = "" if name == configs[0] else f"{name}."
            config.update(scalars_of(value, sub))
            arrays.update(cfg_arrays(value, f"input.cfg.{sub}"))
        elif name in names:
            key = names[name]
            arrays.update(arrays_of(key + "." if _is_namedtuple(value) else "",
                                    value if _is_namedtuple(value) else {key: value}))
        elif name == "state":
            arrays.update(arrays_of("input.state.", value))
        elif name in ("X", "y"):
            idx = fields.get("idx")
            arrays[f"input.batch.{name}"] = np.asarray(value if idx is None else value[idx])
        elif name == "idx":
            arrays["input.batch.idx"] = np.asarray(value)
        else:
            arrays.update(arrays_of("input.", {name: value}))
    order = ("input.state.", "input.cfg.", "input.batch.idx", "input.batch.", "input.eps")
    rank = {n: next((i for i, p in enumerate(order) if n.startswith(p)), len(order))
            for n in arrays}
    arrays = {n: arrays[n] for n in sorted(arrays, key=lambda n: rank[n])}
    outputs = {n: a[None] for n, a in arrays_of("", info).items()}
    table = field_tags(type(info))
    tags = {n: table.get(n.split(".")[0], "") for n in outputs}
    return arrays, outputs, tags, config, model_spec(inputs.model), set()
