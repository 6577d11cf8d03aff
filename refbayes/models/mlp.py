"""Multilayer perceptron on a flat theta: the network every method trains.

Implements the FlatModel interface (refbayes.models.base) for
h_0 = x, h_l = act(h_{l-1} W_l + b_l) (l < L), f = h_{L-1} W_L + b_L, with
derivations/per_example_gradients.md (peg.1)-(peg.17).
"""
from __future__ import annotations

from refbayes.models._layers import ACTIVATIONS
from refbayes.models.base import FlatModel, _check_sizes
from refbayes.models.likelihoods import LIKELIHOODS, make_likelihood

__all__ = ["MLP"]


class MLP(FlatModel):
    """MLP(sizes, activation="relu", likelihood="gaussian", noise_precision=1.0).

    sizes = [n_in, hidden..., n_out]; activation in ("relu", "tanh", "sigmoid") for the hidden
    layers (relu'(0) is defined as 0); likelihood in ("gaussian", "bernoulli", "categorical"):
    gaussian with noise precision tau = ``noise_precision`` on n_out real outputs, bernoulli on
    one logit (n_out == 1), categorical on n_out >= 2 logits. D = sum_l (n_{l-1} + 1) n_l.
    Targets y: gaussian (M,) when n_out == 1 or (M, n_out) floats; classification (M,) labels
    (integer dtype, or integer-valued floats).
    ``hessian`` uses autograd (NumPy only); everything else runs on NumPy or CuPy.
    """

    __slots__ = ()

    def __init__(self, sizes, activation="relu", likelihood="gaussian", noise_precision=1.0):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood: expected one of {LIKELIHOODS}, got {likelihood!r}")
        sizes = _check_sizes(sizes, likelihood)
        super().__init__(sizes, activation, make_likelihood(likelihood, noise_precision), bias=True)

    def __repr__(self):
        tau = (f", noise_precision={self.likelihood.noise_precision}"
               if self.likelihood.name == "gaussian" else "")
        return (f"MLP({list(self.sizes)}, activation={self.activation!r}, "
                f"likelihood={self.likelihood.name!r}{tau})")
