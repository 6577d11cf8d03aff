"""Flat-theta models: losses, gradients, per-example gradients, GGN / Hessian, diagonals, K-FAC inputs.

Every model maps one flat parameter vector theta (D,) and inputs X (M, n_in) to outputs f
(M, n_out) and a SUMMED negative log-likelihood; see refbayes.models.base.FlatModel for the
method contract and derivations/per_example_gradients.md for the equations (peg.N).
"""
from refbayes.models._layers import layout as theta_layout
from refbayes.models._layers import unflatten as unflatten_theta
from refbayes.models._numba_kernels import warmup
from refbayes.models.base import IMPLS, FlatModel, KFACLayer
from refbayes.models.conv import (CNN, CNN_IMPLS, Activation, AvgPool2d, Conv2d, Dense, Flatten,
                                  MaxPool2d, lenet5, tiny_cnn)
from refbayes.models.likelihoods import (LIKELIHOODS, Bernoulli, Categorical, Gaussian,
                                         make_likelihood)
from refbayes.models.linear import LogisticRegression, SoftmaxRegression, add_intercept
from refbayes.models.mlp import MLP

__all__ = ["MLP", "LogisticRegression", "SoftmaxRegression", "add_intercept", "FlatModel",
           "KFACLayer", "IMPLS", "Gaussian", "Bernoulli", "Categorical", "make_likelihood",
           "LIKELIHOODS", "warmup", "theta_layout", "unflatten_theta",
           "CNN", "CNN_IMPLS", "Conv2d", "MaxPool2d", "AvgPool2d", "Flatten", "Dense", "Activation",
           "tiny_cnn", "lenet5"]
