"""refbayes: ground-truth implementations of Bayesian deep-learning posterior approximations.

Subpackages: ``linalg`` (structured Gaussian algebra), ``models`` (flat-theta models with
per-example gradients and curvature), ``methods`` (one module per method), ``datasets``,
``experiments``. See README.md for the method table and derivations/ for the equations.

The subpackages are imported explicitly: ``import refbayes`` loads only ``__version__`` and
``unchecked`` (about 60 ms), so ``refbayes.methods`` needs ``import refbayes.methods`` (or
``from refbayes.methods import vogn``) first. Importing them all here would cost every import of
refbayes, and the start-up of the ``refbayes`` command, about 400 ms more (``refbayes.methods``
alone, with the SciPy it loads), and would put this package above its own subpackages in the
import layers (tests/test_import_graph.py).
"""
__version__ = "0.1.0"

from refbayes._checks import unchecked  # noqa: E402  (the public switch of the value checks)

__all__ = ["__version__", "unchecked"]

# what `refbayes.NAME` before `import refbayes.NAME` says (nothing is imported here)
_SUBPACKAGES = ("linalg", "models", "methods", "datasets", "experiments", "tracing",
                "conformance", "conventions", "metrics", "layout", "cli", "verify", "trace",
                "golden", "backend")


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        raise AttributeError(f"module 'refbayes' has no attribute {name!r}: its subpackages are "
                             f"imported explicitly (`import refbayes.{name}`)")
    raise AttributeError(f"module 'refbayes' has no attribute {name!r}")
