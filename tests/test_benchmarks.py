"""Every asv benchmark runs once at its smallest parameters, so none can rot unnoticed."""
import importlib
import inspect
import itertools
import pkgutil
import re
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


_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_PIN_PROBE = """
import json
{pre}
import benchmarks
from benchmarks import bench_lowrank
bench = bench_lowrank.LowRank()
bench.setup("numpy", 100, 1)  # a benchmark's setup has run: its pools are loaded
print(json.dumps(benchmarks.pin_report()))  # the pools loaded now, the variables now
"""


@pytest.mark.parametrize("numpy_first", [False, True], ids=["as-asv-runs-them", "numpy-first"])
def test_thread_pin_in_a_fresh_benchmark_process(numpy_first):
    """asv runs benchmarks in processes of its own that import the benchmarks package (its
    __init__, the pin) before any benchmark module: there every BLAS / OpenMP pool has one thread
    though the caller set no thread variable (the pin sets them before NumPy loads), and so it
    does where NumPy was loaded first (threadpoolctl's limit alone; the environment untouched)."""
    import json
    import os
    import subprocess
    env = {k: v for k, v in os.environ.items()  # the caller sets no thread variable
           if not k.endswith(("_NUM_THREADS", "_MAXIMUM_THREADS"))
           and k != "REFBAYES_BENCH_THREADS"}
    code = _PIN_PROBE.format(pre="import numpy" if numpy_first else "")
    run = subprocess.run([sys.executable, "-c", code], cwd=BENCH_ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["numpy_before_pin"] is numpy_first
    assert out["threads"] == 1
    # NumPy's BLAS and SciPy's own are both loaded, and every pool has one thread
    assert {"numpy", "scipy"} <= {k for _, path, _ in out["pools"] for k in ("numpy", "scipy")
                                  if f"{k}.libs" in path or f"/{k}/" in path}, out["pools"]
    assert all(n == 1 for _, _, n in out["pools"]), out["pools"]
    for var in _THREAD_VARS:
        assert out["env"][var] == (None if numpy_first else "1"), out["env"]


def test_every_benchmark_module_is_in_the_pinned_package():
    """The pin lives in benchmarks/__init__.py, which Python runs before any module of the
    package: every benchmark file must sit in that package (no second benchmark folder, no
    module that resets the thread variables or limits)."""
    bench_dir = BENCH_ROOT / "benchmarks"
    assert (bench_dir / "__init__.py").is_file()
    assert not [p for p in BENCH_ROOT.rglob("*.py") if p.parent != bench_dir]
    modules = {n.split(".")[0] for n, _ in CASES}
    assert modules == {p.stem for p in bench_dir.glob("bench_*.py")}
    for path in bench_dir.glob("*.py"):
        if path.name == "__init__.py":
            continue
        text = path.read_text(encoding="utf-8")
        found = re.findall(r"os\.environ\b|putenv|threadpool_limits|thread_limit\(", text)
        assert not found, f"{path.name}: {found}: the thread pin is benchmarks/__init__.py's"
