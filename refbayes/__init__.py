"""refbayes: ground-truth implementations of Bayesian deep-learning posterior approximations.

Subpackages: ``linalg`` (structured Gaussian algebra), ``models`` (flat-theta models with
per-example gradients and curvature), ``methods`` (one module per method), ``datasets``,
``experiments``. See README.md for the method table and derivations/ for the equations.
"""
__version__ = "0.1.0"

from refbayes._checks import unchecked  # noqa: E402  (the public switch of the value checks)

__all__ = ["__version__", "unchecked"]
