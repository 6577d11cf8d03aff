"""Every asv benchmark runs once at its smallest parameters, so none can rot unnoticed."""
import importlib
import inspect
import itertools
import pkgutil
import sys
from pathlib import Path

import pytest

from refbayes.methods import exact_vi
from tests.tolerances import EXACT_F64

BENCH_ROOT = Path(__file__).resolve().parents[1] / "asv_benchmarks"


def _benchmark_classes():
    sys.path.insert(0, str(BENCH_ROOT))
    try:
        package = importlib.import_module("benchmarks")
        for info in pkgutil.iter_modules(package.__path__):
            if info.name == "common":
                continue
            module = importlib.import_module(f"benchmarks.{info.name}")
            for name, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == module.__name__:
                    yield f"{info.name}.{name}", cls
    finally:
        sys.path.remove(str(BENCH_ROOT))


def _combos(cls):
    """Parameter combinations, the smallest first (asv lists small sizes first): the test runs the
    first one that setup does not skip (no CuPy, too large)."""
    params = getattr(cls, "params", None)
    if not params:
        return [()]
    if len(cls.param_names) == 1 and not isinstance(params[0], (list, tuple)):
        params = (params,)
    return list(itertools.product(*params))


CASES = list(_benchmark_classes())


def test_benchmarks_found():
    assert {"bench_lowrank.LowRank", "bench_per_example.PerExampleGrads"} <= {c for c, _ in CASES}


@pytest.mark.parametrize("cls", [c for _, c in CASES], ids=[n for n, _ in CASES])
def test_benchmark_runs_once(cls):
    ran, skipped = 0, []
    for combo in _combos(cls):
        bench = cls()
        try:
            if hasattr(bench, "setup"):
                bench.setup(*combo)
        except NotImplementedError as err:
            skipped.append(str(err))
            continue  # asv's skip: try the next combination
        for attr in dir(bench):
            if attr.startswith(("time_", "peakmem_", "track_", "mem_")):
                out = getattr(bench, attr)(*combo)
                if attr.endswith("_rel_err"):  # accuracy figures: structured vs dense, float64
                    assert 0 <= out <= EXACT_F64, f"{attr}{combo} = {out!r}"
                if attr.endswith("_grad_norm"):  # exact VI's stopping quantity, fit_full's tol
                    tol = exact_vi.fit_full.__kwdefaults__["tol"]
                    assert 0 <= out <= tol, f"{attr}{combo} = {out!r}"
                ran += 1
        break
    if ran == 0 and skipped and all("REFBAYES_DATA" in r for r in skipped):
        pytest.skip(f"{cls.__name__}: {skipped[0]}")  # data benchmarks, as the data tests do
    assert ran > 0, f"{cls.__name__}: every combination was skipped"
