"""Golden traces: every method's inputs, draws and named intermediates over K steps, under their
equation tags, in one portable file that another implementation is verified against.

- ``build(method, seed=, steps=, dtype=, model=, **options)`` runs a registered method on its
  shipped problem (or, ``model="tiny-cnn"``, on the tiny CNN) and returns a ``Trace``; ``save`` / ``load`` write and read it (npz with a JSON
  manifest); ``format_trace`` / ``to_json`` are its one printed and one JSON form.
- ``TRACERS`` is filled by the recipe modules imported below, one per method family: ``steps``
  (slang, ngvi), ``laplace``, ``swag``, ``kfac``, ``ktied`` and ``drivers`` (every method record
  of ``refbayes.methods.records`` that names a trace start).
- ``problems`` holds the shipped problems and ``find_map``.

The trace format, the problems, the starts and the order of the draws are specified in
``derivations/tracing.md``. Bless the committed traces after an intended numerical change with
``python -m refbayes.tracing tests/golden``.
"""
# the recipes register their tracers at import, in this order (the order `refbayes trace` lists)
from refbayes.tracing import steps  # noqa: F401, I001
from refbayes.tracing import laplace  # noqa: F401
from refbayes.tracing import swag  # noqa: F401
from refbayes.tracing import kfac  # noqa: F401
from refbayes.tracing import ktied  # noqa: F401
from refbayes.tracing import drivers  # noqa: F401
from refbayes.tracing.chain import (Chain, arrays_of, cfg_arrays, fit_arrays, model_from_spec,
                                    model_spec, run_chain, scalars_of)
from refbayes.tracing.files import FORMAT, FORMAT_VERSION, Trace, load, read_npz, save
from refbayes.tracing.printing import format_trace, format_values, to_json
from refbayes.tracing.problems import MAPResult, find_map
from refbayes.tracing.tags import NOTE_OF, derivation_of, field_tags
from refbayes.tracing.tracer import (DTYPES, TRACERS, Tracer, bless, build, command_line,
                                     get_tracer, register)

__all__ = ["DTYPES", "FORMAT", "FORMAT_VERSION", "NOTE_OF", "TRACERS", "Chain", "MAPResult",
           "Trace", "Tracer", "arrays_of", "bless", "build", "cfg_arrays", "command_line",
           "derivation_of", "field_tags", "find_map", "fit_arrays", "format_trace",
           "format_values", "get_tracer", "load", "model_from_spec", "model_spec", "read_npz",
           "register", "run_chain", "save", "scalars_of", "to_json"]
