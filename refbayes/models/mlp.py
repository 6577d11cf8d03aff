"""Multilayer perceptron on a flat theta: the network every method trains.

Implements the FlatModel interface (refbayes.models.base) for
h_0 = x, h_l = act(h_{l-1} W_l + b_l) (l < L), f = h_{L-1} W_L + b_L, with
derivations/per_example_gradients.md (peg.1)-(peg.12), (peg.17)-(peg.21).
"""
from __future__ import annotations

from refbayes.models._layers import ACTIVATIONS
from refbayes.models.base import FlatModel, _check_sizes
from refbayes.models.likelihoods import LIKELIHOODS, make_likelihood

__all__ = ["MLP"]


class MLP(FlatModel):
    """Multilayer perceptron with a bias in every layer, on a flat theta.

    D = sum_l (n_{l-1} + 1) n_l.  Targets y: gaussian (M,) when n_out == 1 or (M, n_out) floats;
    classification (M,) labels (integer dtype, or integer-valued floats).  ``hessian`` uses
    autograd (NumPy only); everything else runs on NumPy or CuPy.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths [n_in, hidden..., n_out], each >= 1.
    activation : {"relu", "tanh", "sigmoid"}, default "relu"
        Activation of the hidden layers (relu'(0) is defined as 0); the last layer is linear.
    likelihood : {"gaussian", "bernoulli", "categorical"}, default "gaussian"
        Gaussian on n_out real outputs, bernoulli on one logit (n_out == 1), categorical on
        n_out >= 2 logits.
    noise_precision : float, default 1.0
        The gaussian likelihood's noise precision tau > 0, finite (checked for every
        likelihood; only the gaussian uses it).

    Raises
    ------
    ValueError
        If activation or likelihood is not one of the names above, sizes is not a list of at
        least two integers >= 1, n_out does not fit the likelihood, or noise_precision is not
        a finite number in (0, inf).
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
