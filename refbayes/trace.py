"""Deprecated: the tracing package is ``refbayes.tracing``; this module re-exports its names for
one release (``refbayes.trace`` was the ``refbayes trace`` command and its recipes)."""
from refbayes.tracing import *  # noqa: F401, F403
from refbayes.tracing import __all__ as _tracing_all
from refbayes.tracing.cli import add_arguments, run
from refbayes.tracing.kfac import (
                                   KFAC_METHODS,
                                   NoisyKFACTraceInfo,
                                   NoisyKFACTraceInputs,
                                   make_noisy_kfac_inputs,
                                   trace_noisy_kfac,
)
from refbayes.tracing.ktied import KTiedTraceInputs, make_ktied_inputs
from refbayes.tracing.laplace import (
                                   LAPLACE_METHODS,
                                   LaplaceInfo,
                                   LaplaceTraceInputs,
                                   RiemannianLaplaceInfo,
                                   make_laplace_inputs,
                                   trace_laplace,
)
from refbayes.tracing.problems import MAP_GTOL  # noqa: F401
from refbayes.tracing.steps import STEP_METHODS, TraceInputs, make_inputs, step
from refbayes.tracing.swag import SWAGTraceInfo, SWAGTraceInputs, make_swag_inputs, trace_swag

__all__ = [*_tracing_all, "KFAC_METHODS", "KTiedTraceInputs", "LAPLACE_METHODS", "LaplaceInfo",
           "LaplaceTraceInputs", "NoisyKFACTraceInfo", "NoisyKFACTraceInputs",
           "RiemannianLaplaceInfo", "STEP_METHODS", "SWAGTraceInfo", "SWAGTraceInputs",
           "TraceInputs", "add_arguments", "make_inputs", "make_ktied_inputs",
           "make_laplace_inputs", "make_noisy_kfac_inputs", "make_swag_inputs", "run", "step",
           "trace_laplace", "trace_noisy_kfac", "trace_swag"]
