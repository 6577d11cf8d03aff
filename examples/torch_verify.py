"""Verify a PyTorch implementation of VOGN, SLANG, BBB and Adam against refbayes' golden traces.

This is a worked example of ``refbayes verify``: an independent PyTorch (float64) implementation
of one VOGN step and one SLANG step, written from the equations of ``derivations/vogn.md`` and
``derivations/slang.md`` (not by calling refbayes' steps), a Bayes-by-Backprop loop (mu, rho,
sigma = softplus(rho), the reparameterised draws with the trace's eps, the closed-form KL, autograd
and ``torch.optim.Adam``; (bbb.1)-(bbb.10) of ``derivations/bbb.md``), and a MAP / Adam training
loop with ``torch.optim.Adam`` ((adam.1)-(adam.6) of ``derivations/bbb.md``). refbayes is used
only to read the golden trace (``refbayes.tracing.load``) and to put its parameter axes into
torch's order (``refbayes.layout.from_refbayes``). The script feeds the trace's inputs to the
torch code (the starting state, then each step's minibatch and Gaussian draws ``eps``), chains the
K steps, and writes every quantity the trace holds, in torch's parameter order, with
``numpy.savez``.

The three commands (VOGN; for SLANG use ``refbayes trace slang --steps 2 --save slang.npz`` and
``slang`` as the first argument; the ``slang-mlp`` trace, SLANG on an MLP, works the same)::

    refbayes trace vogn --steps 2 --save vogn.npz
    python examples/torch_verify.py vogn vogn.npz mine.npz
    refbayes verify vogn.npz mine.npz --layout torch

The last one prints one row per quantity and step, in the order the step computes them, and a
verdict; it exits 0 (abridged)::

    refbayes verify: vogn, 28 comparisons
    step  quantity     tag                 max abs err  max rel err  tol       worst index  verdict
    ----  -----------  ------------------  -----------  -----------  --------  -----------  -------
    1     N_eff        (vogn.2)            0.00e+00     0.00e+00     1.00e-10  -            ok
    1     delta_tilde  (vogn.2)            0.00e+00     0.00e+00     1.00e-10  -            ok
    1     sigma        (vogn.4)            0.00e+00     0.00e+00     1.00e-10  -            ok
    1     theta        (vogn.4)            0.00e+00     0.00e+00     1.00e-10  -            ok
    1     g_k          (vogn.5)            4.86e-17     2.90e-16     1.00e-10  (0, 14)      ok
    1     h_k          (vogn.5)            8.33e-17     3.36e-16     1.00e-10  (1, 13)      ok
    ...
    2     state.t      -                   0.00e+00     0.00e+00     0.00e+00  -            ok
    note: parameter axes read in the 'torch' layout
    OK: every compared quantity agrees (28 comparisons).

With ``--bug`` the script plants one classic mistake, and ``refbayes verify`` names the equation
where it first shows, and exits 1::

    1     g_k          (vogn.5)            4.86e-17     2.90e-16     1.00e-10  (0, 14)      ok
    1     h_k          (vogn.5)            2.20e-01     8.87e-01     1.00e-10  (0, 32)      DIVERGES
    1     g_hat        (vogn.5), (vogn.6)  2.78e-17     1.98e-16     1.00e-10  (18,)        ok
    1     h_hat        (vogn.5), (vogn.6)  2.13e-01     9.18e-01     1.00e-10  (32,)        DIVERGES
    ...
    FIRST DIVERGENCE: step 1, h_k (vogn.5), derived in derivations/vogn.md: diverges; max abs
    err 2.20e-01, max rel err 8.87e-01 > tol 1.00e-10 at index (0, 32) (yours 0.02810441122,
    trace 0.2477340315)
    Every quantity compared before it agrees: check that equation first.
    17 of 28 comparisons fail.

(The worst index is a position in your dump, in its own (torch) order.)

The planted mistakes:

- vogn: the curvature from the square of the minibatch-MEAN gradient,
  hhat_k = ((1/M) sum_i g_{k,i})^2, instead of the mean of the per-example squares
  hhat_k = (1/M) sum_i g_{k,i}^2 (the "Gauss-Newton" mistake); it breaks (vogn.5), first seen
  in h_k.
- slang: the prior gradient left out of line 11, g_tilde = (N / (M S)) sum g_{s,i} instead of
  (N / (M S)) sum g_{s,i} + lam * mu; it breaks (slang.5), first seen in g_tilde (everything
  before it, including the new U and d, still agrees).
- adam: the minibatch loss summed without its N / M factor, g_data = sum_i grad l_i instead of
  (N / M) sum_i grad l_i; it breaks (adam.5), first seen in g_data (the step's first quantity).
- bbb: the KL's sign, KL(q || p) computed as its negative (the ELBO's sign mixed up: minimizing
  data loss - KL); it breaks (bbb.7), first seen in kl (sigma, theta, g, g_hat and g_rho before
  it still agree).

BBB's Adam state and step run over [mu; rho] (2 D,): two theta-shaped blocks, each in torch's
order in the dump, converted block by block (``refbayes.layout.from_refbayes(..., blocks=2)``
for the inputs; ``refbayes verify --layout torch`` does the same for ``delta``,
``state.adam.m`` and ``state.adam.v``)::

    refbayes trace bbb --steps 2 --save bbb.npz              # or --model tiny-cnn
    python examples/torch_verify.py bbb bbb.npz mine.npz
    refbayes verify bbb.npz mine.npz --layout torch          # 34 comparisons agree, exit 0

A CNN. The model is read from the trace, so the same code runs on the tiny-CNN traces
(``refbayes trace METHOD --model tiny-cnn``, committed as ``tests/golden/<method>-cnn.npz``;
derivations/tracing.md "The tiny CNN"): ``make_net`` builds the plain ``nn.Sequential(
nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 3))``, and each row
of the trace's X (a 1x6x6 image flattened in (c, h, w) order) is reshaped to NCHW before the net
reads it. VOGN's per-example gradients (``torch.func.vmap`` of ``torch.func.grad``) and their
squares (the "ef" curvature of the trace, (vogn.5)) need nothing CNN-specific::

    refbayes trace vogn --steps 2 --model tiny-cnn --save vogn-cnn.npz
    python examples/torch_verify.py vogn vogn-cnn.npz mine.npz    # or adam, bbb, slang (slang-mlp)
    refbayes verify vogn-cnn.npz mine.npz --layout torch             # 28 comparisons, exit 0

and ``--bug`` is caught where it is on the MLP (h_k (vogn.5), 17 of 28 comparisons fail; for adam
g_data (adam.5), 12 of 16; for bbb kl (bbb.7), 24 of 34). A dump whose ``nn.Linear`` weight is
flattened transposed, (n_in, n_out), is refbayes' order of the tiny CNN: ``refbayes verify --layout
torch`` reports it at sigma (vogn.4) as a layout mistake.

Parameter order. refbayes' flat theta holds per layer W_l (n_in, n_out) row-major, then b_l;
``torch.nn.utils.parameters_to_vector(net.parameters())`` holds weight (n_out, n_in) row-major,
then bias. A Conv2d weight (C_out, C_in, k_h, k_w) is in the same order in both (conv.2). Every
array below that runs over the D parameters is in torch's order; ``--layout torch`` tells
``refbayes verify`` so.

Requires torch (CPU is enough). Usage::

    python examples/torch_verify.py {adam,bbb,slang,vogn} TRACE.npz OUT.npz [--bug]
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from refbayes import layout, tracing

__all__ = ["METHODS", "adam_steps", "bbb_steps", "main", "make_net", "per_example_grads",
           "slang_steps", "summed_loss", "vogn_steps"]

DTYPE = torch.float64


# ----------------------------------------------------------------------------- the model in torch

def make_net(spec: dict) -> nn.Sequential:
    """The trace's model as a plain torch network: an MLP, or the layers of a CNN.

    Parameters
    ----------
    spec : dict
        The trace's model spec (``Trace.model``): an MLP with tanh activations, a
        LogisticRegression with an intercept (one nn.Linear(n_features, 1)), or a CNN (class
        "CNN", e.g. ``--model tiny-cnn``) of Conv2d, relu / tanh, MaxPool2d, Flatten and Dense
        layers, built as nn.Conv2d, nn.ReLU / nn.Tanh, nn.MaxPool2d, nn.Flatten, nn.Linear.

    Returns
    -------
    torch.nn.Sequential
        The network, float64.

    Raises
    ------
    ValueError
        If the spec is another model, a layer of a kind this example does not build, or the
        network's parameter count is not the trace's D.
    """
    if spec["class"] == "CNN":
        net = nn.Sequential(*[_cnn_layer(layer) for layer in spec["layers"]]).to(DTYPE)
    else:
        if spec["class"] == "MLP" and spec["args"]["activation"] != "tanh":
            raise ValueError(f"model: this example builds tanh MLPs, got {spec['repr']}")
        if spec["class"] not in ("MLP", "LogisticRegression") or not spec["bias"]:
            raise ValueError(f"model: expected an MLP or LogisticRegression with biases, or a "
                             f"CNN, got {spec['repr']}")
        sizes = spec["sizes"]
        layers = []
        for l in range(len(sizes) - 1):
            if l > 0:
                layers.append(nn.Tanh())
            layers.append(nn.Linear(sizes[l], sizes[l + 1], bias=True))
        net = nn.Sequential(*layers).to(DTYPE)
    D = sum(p.numel() for p in net.parameters())
    if D != spec["D"]:
        raise ValueError(f"model: the torch network has {D} parameters, the trace says {spec['D']}")
    return net


def _cnn_layer(layer: dict) -> nn.Module:
    """One layer of a CNN spec as the torch module a user would write (NCHW, as refbayes)."""
    kind = layer["type"]
    if kind == "Conv2d":
        return nn.Conv2d(layer["c_in"], layer["c_out"], tuple(layer["kernel"]),
                         stride=tuple(layer["stride"]), padding=tuple(layer["padding"]),
                         bias=layer["bias"])
    if kind == "Activation" and layer["name"] in ("relu", "tanh"):
        return nn.ReLU() if layer["name"] == "relu" else nn.Tanh()
    if kind == "MaxPool2d":
        return nn.MaxPool2d(tuple(layer["kernel"]), stride=tuple(layer["stride"]))
    if kind == "Flatten":
        return nn.Flatten()  # (C, H, W) row-major, as refbayes' Flatten (conv.15)
    if kind == "Dense":
        return nn.Linear(layer["n_in"], layer["n_out"], bias=layer["bias"])
    raise ValueError(f"model: this example builds Conv2d, relu / tanh, MaxPool2d, Flatten and "
                     f"Dense layers, got {layer}")


def _likelihood(spec: dict) -> str:
    if spec["class"] == "LogisticRegression":
        return "bernoulli"
    if spec["class"] == "CNN":
        return spec["likelihood"]
    return spec["args"]["likelihood"]



def _functional(net, spec):
    """(unflatten, likelihood, input shape) for a functional call of ``net``: unflatten(theta)
    splits torch's flat vector (``parameters_to_vector`` order) into the named parameters; the
    input shape (C, H, W) of a CNN spec, else None. Refuses likelihoods this example does not
    handle."""
    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for _, p in net.named_parameters()]
    sizes = [p.numel() for _, p in net.named_parameters()]
    kind = _likelihood(spec)
    in_shape = tuple(spec["input_shape"]) if spec["class"] == "CNN" else None
    if kind not in ("categorical", "bernoulli"):
        raise ValueError(f"model: this example handles categorical and bernoulli likelihoods, "
                         f"got {kind!r}")

    def unflatten(theta):
        return {n: t.reshape(s) for n, t, s in zip(names, torch.split(theta, sizes), shapes)}
    return unflatten, kind, in_shape

def per_example_grads(net: nn.Sequential, spec: dict):
    """A function G(theta, X, y) -> (M, D): the gradients of l_i = -log p(y_i | x_i, theta).

    theta is torch's flat vector (``parameters_to_vector`` order); the gradients come from
    ``torch.func.vmap(torch.func.grad(...))`` over the rows, in the same order. A CNN's rows
    are flattened images, as the trace's X holds them; each is reshaped to the spec's
    ``input_shape`` (C, H, W) before the network reads it.
    """
    unflatten, kind, in_shape = _functional(net, spec)

    def loss_i(theta, x, y):
        params = unflatten(theta)
        x = x[None] if in_shape is None else x.reshape((1,) + in_shape)  # a batch of one
        f = functional_call(net, params, (x,))  # (1, n_out) logits
        if kind == "categorical":  # l_i = logsumexp(f_i) - f_{i, y_i}
            return nn.functional.cross_entropy(f, y.long()[None], reduction="sum")
        return nn.functional.binary_cross_entropy_with_logits(f[:, 0], y[None], reduction="sum")

    return vmap(grad(loss_i), in_dims=(None, 0, 0))


# The parameter axes of each input, in refbayes order in the trace (leading step axis counted).
_PARAM_AXES = {"input.state.mu": (0,), "input.state.rho": (0,), "input.state.s": (0,),
               "input.state.m": (0,),
               "input.state.U": (0,), "input.state.d": (0,), "input.state.g_bar": (0,),
               "input.cfg.lam": (0,), "input.cfg.delta": (0,), "input.eps": (1,),
               "input.state.theta": (0,), "input.state.adam.m": (0,),
               "input.state.adam.v": (0,)}


# The inputs that stack k theta-shaped blocks along their parameter axis: method -> name -> k.
# BBB's Adam moments run over [mu; rho], two D-blocks (each converted on its own).
_BLOCKS = {"bbb": {"input.state.adam.m": 2, "input.state.adam.v": 2}}


def _inputs(trace):
    """The trace's inputs as torch tensors, parameter axes converted to torch's order."""
    model = tracing.model_from_spec(trace.model)
    blocks = _BLOCKS.get(trace.method, {})
    out = {}
    for name, a in trace.inputs.items():
        a = np.asarray(a)
        axes = _PARAM_AXES.get(name, ())
        if axes and a.ndim > max(axes):  # a scalar delta has no parameter axis
            a = layout.from_refbayes(a, model, "torch", axes=axes, blocks=blocks.get(name, 1))
        out[name] = torch.from_numpy(np.array(a))  # a copy; keeps 0-d arrays 0-d
    return out


def _stack(rows: list) -> dict:
    return {n: np.stack([np.asarray(r[n]) for r in rows]) for n in rows[0]}


def _np(x):
    return x.detach().numpy().copy() if torch.is_tensor(x) else np.asarray(x)


# ----------------------------------------------------------------------------- VOGN

def vogn_steps(trace, bug: bool = False) -> dict:
    """K chained VOGN steps (derivations/vogn.md, (vogn.2)-(vogn.9)) in torch.

    Parameters
    ----------
    trace : refbayes.tracing.Trace
        A ``vogn`` golden trace (an MLP or a CNN, curvature "ef").
    bug : bool, default False
        Plant the Gauss-Newton mistake: h_k from the square of the minibatch-mean gradient.

    Returns
    -------
    dict of str to numpy.ndarray
        Every output of the trace by name, leading step axis K, parameter axes in torch order.
    """
    if trace.method != "vogn" or trace.config["curvature"] != "ef":
        raise ValueError(f"trace: expected a vogn trace with curvature 'ef', got {trace.method} "
                         f"{trace.config.get('curvature')!r}")
    c = trace.config
    inp = _inputs(trace)
    net = make_net(trace.model)
    G_of = per_example_grads(net, trace.model)
    mu, s, m = (inp[f"input.state.{n}"] for n in ("mu", "s", "m"))
    t = int(inp["input.state.t"])
    # the prior precision: a scalar (in the config) or a (D,) array (an input)
    delta = inp["input.cfg.delta"] if "input.cfg.delta" in inp else float(c["delta"])
    N, alpha, beta1, beta2 = c["N"], c["alpha"], c["beta1"], c["beta2"]
    gamma, tau, rho = c["gamma"], c["tau"], c["rho"]
    K = inp["input.eps"].shape[0]
    rows = []
    for k in range(K):
        X, y, eps = inp["input.batch.X"][k], inp["input.batch.y"][k], inp["input.eps"][k]
        N_eff = rho * N                                                    # (vogn.2)
        delta_tilde = tau * delta / N_eff                                  # (vogn.2)
        sigma = torch.sqrt(tau / (N_eff * (s + delta_tilde + gamma)))     # (vogn.4), old s
        theta = mu[:, None] + sigma[:, None] * eps                         # (vogn.4), (D, S)
        g_k, h_k = [], []
        for j in range(theta.shape[1]):
            G = G_of(theta[:, j], X, y)                                    # (M, D) per example
            g_k.append(G.mean(dim=0))                                      # (vogn.5)
            if bug:  # the Gauss-Newton mistake: square of the minibatch mean
                h_k.append(G.mean(dim=0) ** 2)
            else:    # mean of the per-example squares
                h_k.append((G ** 2).mean(dim=0))                           # (vogn.5)
        g_k, h_k = torch.stack(g_k), torch.stack(h_k)                      # (S, D)
        g_hat, h_hat = g_k.mean(dim=0), h_k.mean(dim=0)                    # (vogn.5)
        m = beta1 * m + (g_hat + delta_tilde * mu)                         # (vogn.7)
        s = (1 - beta2) * s + beta2 * h_hat                                # (vogn.8)
        prec_diag = (N_eff / tau) * (s + delta_tilde + gamma)              # (vogn.4), new s
        Delta_mu = alpha * m / (s + delta_tilde + gamma)                   # (vogn.9)
        mu = mu - Delta_mu                                                 # (vogn.9)
        t += 1
        rows.append({"N_eff": np.float64(N_eff), "delta_tilde": _np(delta_tilde),
                     "sigma": _np(sigma), "theta": _np(theta), "g_k": _np(g_k),
                     "h_k": _np(h_k), "g_hat": _np(g_hat), "h_hat": _np(h_hat), "m": _np(m),
                     "s": _np(s), "prec_diag": _np(prec_diag), "Delta_mu": _np(Delta_mu),
                     "mu": _np(mu), "state.t": np.int64(t)})
    return _stack(rows)


# ----------------------------------------------------------------------------- SLANG

def _top_eig(A, L: int):
    """U (D, L) with U U^T the best rank-L part of the PSD matrix A: eigh, top L, sqrt-scaled;
    each column's sign fixed so that its largest-|entry| (the first on ties) is >= 0."""
    lam, Q = torch.linalg.eigh(A)                     # ascending
    lam, Q = lam.flip(0)[:L], Q.flip(1)[:, :L]
    U = Q * torch.sqrt(torch.clamp(lam, min=0.0))
    big = torch.argmax(U.abs(), dim=0)                # first index of the max on ties
    sign = torch.where(U[big, torch.arange(L)] < 0, -1.0, 1.0).to(U.dtype)
    return U * sign


def slang_steps(trace, bug: bool = False) -> dict:
    """K chained SLANG steps (derivations/slang.md, (slang.2)-(slang.8), (ngvi.12), (ngvi.13)).

    Parameters
    ----------
    trace : refbayes.tracing.Trace
        A ``slang`` golden trace (exact fast_eig, symmetric sampler).
    bug : bool, default False
        Plant a mistake in (slang.5): leave the prior gradient lam * mu out of g_tilde.

    Returns
    -------
    dict of str to numpy.ndarray
        Every output of the trace by name, leading step axis K, parameter axes in torch order.
    """
    c = trace.config
    if trace.method not in ("slang", "slang-mlp") or c["eig"] != "exact" \
            or c["sampler"] != "symmetric":
        raise ValueError(f"trace: expected a slang trace with eig 'exact' and sampler "
                         f"'symmetric', got {trace.method} {c.get('eig')!r} {c.get('sampler')!r}")
    inp = _inputs(trace)
    net = make_net(trace.model)
    G_of = per_example_grads(net, trace.model)
    mu, U, d, g_bar = (inp[f"input.state.{n}"] for n in ("mu", "U", "d", "g_bar"))
    t = int(inp["input.state.t"])
    lam = inp["input.cfg.lam"]
    N, L, alpha, beta, decay, b = c["N"], c["L"], c["alpha"], c["beta"], c["decay"], c["momentum"]
    K = inp["input.eps"].shape[0]
    D = mu.shape[0]
    rows = []
    for k in range(K):
        X, y, eps = inp["input.batch.X"][k], inp["input.batch.y"][k], inp["input.eps"][k]
        M, S = X.shape[0], eps.shape[1]
        shrink = 1.0 if decay == 0 else 1.0 / (1.0 + (t + 1) ** decay)   # (ngvi.12)
        alpha_t, beta_t = alpha * shrink, beta * shrink                   # (ngvi.12)
        one_minus_beta = 1.0 - beta_t                                     # line 2: delta
        # line 4, fast_sample (slang.7): theta = mu + d^{-1/2} T eps, T = (I + V V^T)^{-1/2}
        V = U / torch.sqrt(d)[:, None]
        ev, Q = torch.linalg.eigh(torch.eye(D, dtype=DTYPE) + V @ V.T)
        T = (Q / torch.sqrt(ev)) @ Q.T
        theta = mu[:, None] + (T @ eps) / torch.sqrt(d)[:, None]          # (slang.7), (D, S)
        G = torch.stack([G_of(theta[:, j], X, y) for j in range(S)])      # (slang.8), (S, M, D)
        scale = N / (M * S)
        W = torch.cat([math.sqrt(one_minus_beta) * U,
                       math.sqrt(beta_t * scale) * G.reshape(S * M, D).T], dim=1)  # (slang.2)
        U_new = _top_eig(W @ W.T, L)                                      # lines 7, 9 (slang.2)
        Delta_d = (W ** 2).sum(dim=1) - (U_new ** 2).sum(dim=1)           # line 8 (slang.3)
        d_new = one_minus_beta * d + Delta_d + beta_t * lam               # line 10 (slang.4)
        g_hat = scale * G.sum(dim=(0, 1))                                 # (ngvi.8)
        if bug:  # the prior gradient forgotten
            g_tilde = g_hat
        else:
            g_tilde = g_hat + lam * mu                                    # line 11 (slang.5)
        if b == 0:                                                        # (ngvi.13)
            direction = g_tilde
        else:
            g_bar = b * g_bar + (1 - b) * g_hat
            direction = g_bar / (1 - b ** (t + 1)) + lam * mu
        P = U_new @ U_new.T + torch.diag(d_new)                           # (slang.1)
        Delta_mu = torch.linalg.solve(P, direction)                       # line 12 (slang.6)
        mu = mu - alpha_t * Delta_mu                                      # line 13 (slang.6)
        U, d, t = U_new, d_new, t + 1
        rows.append({"alpha_t": np.float64(alpha_t), "beta_t": np.float64(beta_t),
                     "theta": _np(theta), "G": _np(G), "W": _np(W), "U": _np(U),
                     "Delta_d": _np(Delta_d), "d": _np(d), "g_tilde": _np(g_tilde),
                     "direction": _np(direction), "Delta_mu": _np(Delta_mu), "mu": _np(mu),
                     "state.g_bar": _np(g_bar), "state.t": np.int64(t)})
    return _stack(rows)


# ----------------------------------------------------------------------------- MAP / Adam

def adam_steps(trace, bug: bool = False) -> dict:
    """K chained MAP / Adam steps (derivations/bbb.md, (adam.1)-(adam.6)) with torch.optim.Adam.

    The training loop a PyTorch user writes: the trace's theta loaded into the network's own
    parameters, the summed minibatch loss scaled by N / M and ``backward()`` (the data gradient
    of (adam.5)), and ``torch.optim.Adam(weight_decay=lam)``, whose coupled L2 term adds
    lam * theta to the gradient (the prior part of (adam.5)) before (adam.1)-(adam.4); the
    optimizer's moments and step count start from the trace's state.

    Parameters
    ----------
    trace : refbayes.tracing.Trace
        An ``adam`` golden trace (a scalar prior precision lam).
    bug : bool, default False
        Plant the missing-scale mistake: the minibatch loss summed without its N / M factor.

    Returns
    -------
    dict of str to numpy.ndarray
        Every output of the trace by name, leading step axis K, parameter axes in torch order.

    Raises
    ------
    ValueError
        If the trace is not an adam trace with a scalar lam.
    """
    c = trace.config
    if trace.method != "adam" or not np.isscalar(c.get("lam")):
        raise ValueError(f"trace: expected an adam trace with a scalar lam, got {trace.method} "
                         f"lam {c.get('lam')!r}")
    inp = _inputs(trace)
    net = make_net(trace.model)
    params = list(net.parameters())
    kind = _likelihood(trace.model)
    in_shape = tuple(trace.model["input_shape"]) if trace.model["class"] == "CNN" else None
    N, lam = c["N"], float(c["lam"])
    t = int(inp["input.state.t"])
    with torch.no_grad():
        nn.utils.vector_to_parameters(inp["input.state.theta"].clone(), params)
    opt = torch.optim.Adam(params, lr=c["adam.alpha"], betas=(c["adam.beta1"], c["adam.beta2"]),
                           eps=c["adam.eps_adam"], weight_decay=lam, foreach=False)
    # the trace's moments as the optimizer's state; (adam.3) counts from the MAP state's t
    sizes = [q.numel() for q in params]
    for q, m_q, v_q in zip(params, torch.split(inp["input.state.adam.m"], sizes),
                           torch.split(inp["input.state.adam.v"], sizes)):
        opt.state[q] = {"step": torch.tensor(float(t)), "exp_avg": m_q.reshape(q.shape).clone(),
                        "exp_avg_sq": v_q.reshape(q.shape).clone()}
    K = inp["input.batch.X"].shape[0]
    rows = []
    for k in range(K):
        X, y = inp["input.batch.X"][k], inp["input.batch.y"][k]
        M = X.shape[0]
        theta = nn.utils.parameters_to_vector(params).detach().clone()
        f = net(X if in_shape is None else X.reshape((M,) + in_shape))
        if kind == "categorical":
            loss = nn.functional.cross_entropy(f, y.long(), reduction="sum")
        else:
            loss = nn.functional.binary_cross_entropy_with_logits(f[:, 0], y, reduction="sum")
        if not bug:
            loss = (N / M) * loss                                          # (adam.5)
        opt.zero_grad()
        loss.backward()
        g_data = nn.utils.parameters_to_vector([q.grad for q in params]).detach().clone()
        g = g_data + lam * theta                                           # (adam.5)
        opt.step()                               # weight_decay adds lam theta: (adam.1)-(adam.4)
        theta_new = nn.utils.parameters_to_vector(params).detach().clone()  # (adam.6)
        delta = theta_new - theta                                          # (adam.4)
        t += 1
        m = torch.cat([opt.state[q]["exp_avg"].reshape(-1) for q in params])
        v = torch.cat([opt.state[q]["exp_avg_sq"].reshape(-1) for q in params])
        rows.append({"g_data": _np(g_data), "g": _np(g), "delta": _np(delta),
                     "theta": _np(theta_new), "state.adam.m": _np(m), "state.adam.v": _np(v),
                     "state.adam.t": np.int64(t), "state.t": np.int64(t)})
    return _stack(rows)


# ----------------------------------------------------------------------------- Bayes-by-Backprop

def summed_loss(net: nn.Sequential, spec: dict):
    """A function L(theta, X, y) -> sum_{i in B} l_i(theta), l_i = -log p(y_i | x_i, theta).

    theta is torch's flat vector (``parameters_to_vector`` order), differentiable; a CNN's rows
    are reshaped to the spec's ``input_shape`` (C, H, W) before the network reads them.
    """
    unflatten, kind, in_shape = _functional(net, spec)

    def loss(theta, X, y):
        params = unflatten(theta)
        f = functional_call(net, params, (X if in_shape is None
                                          else X.reshape((X.shape[0],) + in_shape),))
        if kind == "categorical":
            return nn.functional.cross_entropy(f, y.long(), reduction="sum")
        return nn.functional.binary_cross_entropy_with_logits(f[:, 0], y, reduction="sum")

    return loss


def bbb_steps(trace, bug: bool = False) -> dict:
    """K chained Bayes-by-Backprop steps (derivations/bbb.md, (bbb.1)-(bbb.10)) in torch.

    The loop a PyTorch user writes: mu and rho as leaf tensors, sigma = softplus(rho), the
    reparameterised draws theta_s = mu + sigma * eps_s with the trace's eps, the scaled data
    term (N / (M S)) sum_s sum_i l_i(theta_s) differentiated by autograd through the draws (g_hat
    and g_rho), the closed-form KL to N(0, I / lam) differentiated by autograd, and
    ``torch.optim.Adam`` on the two tensors, whose moments and step count start from the trace's
    [mu; rho] state (two D-blocks, each in torch's order).

    Parameters
    ----------
    trace : refbayes.tracing.Trace
        A ``bbb`` golden trace (an MLP or a CNN, a scalar lam).
    bug : bool, default False
        Plant the sign mistake: the KL subtracted, KL computed as -KL(q || p).

    Returns
    -------
    dict of str to numpy.ndarray
        Every output of the trace by name, leading step axis K, parameter axes in torch order
        ([mu; rho] quantities as two torch-ordered D-blocks).

    Raises
    ------
    ValueError
        If the trace is not a bbb trace with a scalar lam.
    """
    c = trace.config
    if trace.method != "bbb" or not np.isscalar(c.get("lam")):
        raise ValueError(f"trace: expected a bbb trace with a scalar lam, got {trace.method} "
                         f"lam {c.get('lam')!r}")
    inp = _inputs(trace)
    net = make_net(trace.model)
    loss_of = summed_loss(net, trace.model)
    g_of = vmap(grad(loss_of), in_dims=(0, None, None))  # one summed gradient per draw
    N, lam, kl_weight = c["N"], float(c["lam"]), float(c["kl_weight"])
    mu = inp["input.state.mu"].clone().requires_grad_(True)
    rho = inp["input.state.rho"].clone().requires_grad_(True)
    D = mu.shape[0]
    t = int(inp["input.state.t"])
    opt = torch.optim.Adam([mu, rho], lr=c["alpha"], betas=(c["beta1"], c["beta2"]),
                           eps=c["eps_adam"], foreach=False)
    m0, v0 = inp["input.state.adam.m"], inp["input.state.adam.v"]  # [mu; rho], (2 D,)
    for j, q in enumerate((mu, rho)):
        opt.state[q] = {"step": torch.tensor(float(t)), "exp_avg": m0[j * D:(j + 1) * D].clone(),
                        "exp_avg_sq": v0[j * D:(j + 1) * D].clone()}
    K = inp["input.batch.X"].shape[0]
    rows = []
    for k in range(K):
        X, y, eps = inp["input.batch.X"][k], inp["input.batch.y"][k], inp["input.eps"][k]
        M, S = X.shape[0], eps.shape[1]
        scale = N / (M * S)
        sigma = nn.functional.softplus(rho)                                # (bbb.1)
        theta = mu[:, None] + sigma[:, None] * eps                         # (bbb.2), (D, S)
        losses = torch.stack([loss_of(theta[:, j], X, y) for j in range(S)])
        loss_hat = scale * losses.sum()                                    # (bbb.3)
        g = g_of(theta.detach().T.contiguous(), X, y)                      # (bbb.4), (S, D)
        g_hat, g_rho = torch.autograd.grad(loss_hat, (mu, rho),
                                           retain_graph=True)              # (bbb.5), (bbb.6)
        kl = 0.5 * torch.sum(lam * (sigma ** 2 + mu ** 2) - 1.0 - math.log(lam)
                             - 2.0 * torch.log(sigma))                     # (bbb.7)
        if bug:  # the sign mistake: the KL subtracted from the loss
            kl = -kl
        dkl_dmu, dkl_drho = torch.autograd.grad(kl, (mu, rho))             # (bbb.8)
        grad_mu = g_hat + kl_weight * dkl_dmu                              # (bbb.9)
        grad_rho = g_rho + kl_weight * dkl_drho                            # (bbb.9)
        elbo = -(loss_hat + kl_weight * kl)                                # (bbb.3)
        before = torch.cat([mu, rho]).detach().clone()
        mu.grad, rho.grad = grad_mu.detach().clone(), grad_rho.detach().clone()
        opt.step()                                                         # (adam.1)-(adam.4)
        delta = torch.cat([mu, rho]).detach() - before                     # (bbb.10)
        t += 1
        m = torch.cat([opt.state[q]["exp_avg"] for q in (mu, rho)])
        v = torch.cat([opt.state[q]["exp_avg_sq"] for q in (mu, rho)])
        rows.append({"sigma": _np(sigma), "theta": _np(theta), "g": _np(g), "g_hat": _np(g_hat),
                     "g_rho": _np(g_rho), "kl": _np(kl), "grad_mu": _np(grad_mu),
                     "grad_rho": _np(grad_rho), "loss_hat": _np(loss_hat), "elbo": _np(elbo),
                     "delta": _np(delta), "mu": _np(mu), "rho": _np(rho),
                     "state.adam.m": _np(m), "state.adam.v": _np(v),
                     "state.adam.t": np.int64(t), "state.t": np.int64(t)})
    return _stack(rows)


METHODS = {"adam": adam_steps, "bbb": bbb_steps, "vogn": vogn_steps, "slang": slang_steps}


def main(argv=None) -> int:
    """Run the example: read TRACE, take its K steps in torch, write OUT (npz, torch order).

    Parameters
    ----------
    argv : list of str, optional
        ``[METHOD, TRACE, OUT, (--bug)]`` (default: sys.argv[1:]).

    Returns
    -------
    int
        The exit status, 0.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("method", choices=sorted(METHODS))
    p.add_argument("trace", metavar="TRACE", help="golden trace from `refbayes trace METHOD "
                                                  "--save TRACE`")
    p.add_argument("out", metavar="OUT", help="npz to write (torch parameter order)")
    p.add_argument("--bug", action="store_true", help="plant the method's classic mistake")
    args = p.parse_args(argv)
    torch.set_default_dtype(DTYPE)
    trace = tracing.load(args.trace)
    dump = METHODS[args.method](trace, bug=args.bug)
    np.savez(args.out, **dump)
    K = next(iter(dump.values())).shape[0]
    print(f"wrote {args.out}: {len(dump)} quantities x {K} steps of {trace.method} (torch order)"
          f"{', with the planted bug' if args.bug else ''}; now run: refbayes verify "
          f"{args.trace} {args.out} --layout torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
