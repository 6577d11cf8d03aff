"""tools/device_check.py: the dry run against the CuPy stand-in, and its arithmetic.

The dry run (``--standin --quick``) is what CI can check of the device check: every step runs
against the stand-in, the JSON and the text report are written, and every benchmark module with
a "cupy" backend parameter has rows in the timing table. The bandwidth floor, the bytes rule and
the junit parsing are checked on cases whose answer is known.
"""
import functools
import importlib
import inspect
import json
import os
import pkgutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.tolerances import EXACT_F64, assert_close
from tests.tools import load_tool

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / "tools" / "device_check.py"
STEPS = {"install", "versions", "gpu_tests", "smoke", "benchmarks", "torch", "report"}
STATUSES = {"passed", "failed", "error", "timeout", "skipped", "missing", "not_run"}


dc = load_tool("device_check.py", "device_check")


def _modules_with_cupy_param() -> set[str]:
    """Benchmark modules with a class one of whose parameter lists has "cupy" (found here, not
    by the tool's own discovery)."""
    root = str(REPO / "asv_benchmarks")
    sys.path.insert(0, root)
    try:
        package = importlib.import_module("benchmarks")
        found = set()
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"benchmarks.{info.name}")
            for _, cls in inspect.getmembers(module, inspect.isclass):
                params = getattr(cls, "params", None) or ()
                if cls.__module__ == module.__name__ and any(
                        isinstance(p, (list, tuple)) and "cupy" in p for p in params):
                    found.add(info.name)
        return found
    finally:
        sys.path.remove(root)


def test_standin_quick_run(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ)  # REFBAYES_DATA, when set, goes through to the subprocesses
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run([sys.executable, str(TOOL), "--standin", "--quick", "--out", str(out)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"

    result = json.loads((out / "device_check.json").read_text())
    assert set(result["steps"]) == STEPS
    for name, step in result["steps"].items():
        assert step["status"] in STATUSES, f"{name}: {step}"
    for name in ("versions", "gpu_tests", "smoke", "benchmarks", "report"):
        assert result["steps"][name]["status"] == "passed", f"{name}: {result['steps'][name]}"
    assert result["steps"]["torch"]["status"] == "skipped"
    assert result["mode"] == {"standin": True, "quick": True, "timings_meaningful": False}
    assert result["versions"]["cupy"]["version"].endswith("+standin")

    rows = result["timings"]
    modules = _modules_with_cupy_param()
    assert modules, "no benchmark module has a cupy parameter: the check below would be empty"
    missing = modules - {r["module"] for r in rows}
    assert not missing, f"benchmark modules with a cupy parameter but no timing row: {missing}"
    timed = [r for r in rows if r["status"] == "timed"]
    assert timed and all(r["cupy_s"] > 0 for r in timed)
    assert all(r["floor_s"] is None or r["floor_s"] > 0 for r in timed)
    assert result["bandwidth"]["bytes_per_s"] > 0

    report = (out / "device_check.txt").read_text()
    assert "cupy/floor" in report and "MEANINGLESS" in report
    assert report in res.stdout
    # the steps' raw files end in one archive beside the report
    assert sorted(p.name for p in out.iterdir()) == [
        "device_check.json", "device_check.txt", "raw-logs.tar.gz"]
    with tarfile.open(out / "raw-logs.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"gpu-tests.xml", "smoke.xml", "benchmarks.jsonl"} <= names
    assert sorted(names) == result["raw_logs"]["files"]


def test_bandwidth_floor_arithmetic():
    # a 256 MiB copy in 0.1 s moves 2 * 256 MiB (read + write): 5368709120 bytes/s, at which
    # 256 MiB take 0.05 s
    bw = dc.copy_bandwidth(256 * 2**20, 0.1)
    assert_close(bw, 5368709120.0, EXACT_F64, "bandwidth")
    assert_close(dc.floor_seconds(256 * 2**20, bw), 0.05, EXACT_F64, "floor")
    assert dc.floor_seconds(None, bw) is None
    assert dc.floor_seconds(1024, None) is None
    with pytest.raises(ValueError, match="nbytes, seconds"):
        dc.copy_bandwidth(256, 0.0)


class _Toy:
    """A benchmark whose timed method reads a, parts["b"] (through a dict) and fn (a closure
    over the instance), never unused; run returns one new array and an alias of a."""

    def setup(self):
        self.a = np.arange(10.0)          # 80 bytes, read
        self.parts = {"b": np.ones(20)}   # 160 bytes, read through the dict
        self.unused = np.ones(1000)       # 8000 bytes, never read
        self.fn = lambda: self.a.sum()    # the closure reaches the instance: not followed
        self.scale = functools.partial(np.multiply, 2.0)

    def run(self):
        return self.scale(self.a), self.a  # 80 bytes written, and an input passed through

    def time_it(self):
        self.run()
        self.parts["b"].sum()
        self.fn()


def test_bytes_rule_known_case():
    bench = _Toy()
    bench.setup()
    names, returned = dc.traced_call(bench, "time_it", ())
    assert {"a", "parts", "fn", "run", "scale"} <= names and "unused" not in names
    assert type(bench) is _Toy  # the class swap is undone
    moved = dc.bytes_moved(bench, names, returned, lambda x: isinstance(x, np.ndarray))
    assert moved == {"bytes_in": 240, "bytes_out": 80, "n_in": 2, "n_out": 1, "bytes": 320}


def test_bytes_rule_null_without_device_arrays():
    bench = _Toy()
    bench.setup()
    names, returned = dc.traced_call(bench, "time_it", ())
    moved = dc.bytes_moved(bench, names, returned, lambda x: False)
    assert moved["bytes"] is None
    assert dc.floor_seconds(moved["bytes"], 1e9) is None


def test_cupy_combinations():
    class Bench:
        params = (["numpy", "cupy"], [10, 20], ["x"])
        param_names = ["backend", "D", "kind"]

    class NumpyOnly:
        params = (["numpy"], [10])
        param_names = ["backend", "D"]

    assert dc.cupy_combos(Bench) == [("cupy", 10, "x"), ("cupy", 20, "x")]
    i = dc.backend_index(Bench)
    assert i == 0 and dc.with_backend(("cupy", 10, "x"), i, "numpy") == ("numpy", 10, "x")
    assert dc.params_text(Bench, ("cupy", 20, "x")) == "D=20 kind=x"
    assert dc.backend_index(NumpyOnly) is None and dc.cupy_combos(NumpyOnly) == []


def test_junit_counts(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a" name="test_ok"/>'
        '<testcase classname="tests.a" name="test_bad"><failure message="x&#10;second line"/>'
        '</testcase>'
        '<testcase classname="tests.b" name="test_skip"><skipped message="no"/></testcase>'
        '<testcase classname="tests.b" name="test_err"><error>y</error></testcase>'
        '</testsuite></testsuites>')
    counts = dc.junit_counts(xml)
    assert counts == {"passed": 1, "failed": 1, "skipped": 1, "errors": 1,
                      "failures": ["tests.a::test_bad", "tests.b::test_err"],
                      "failure_messages": {"tests.a::test_bad": "x", "tests.b::test_err": "y"},
                      "skip_reasons": {"no": 1}}
    assert dc.pytest_status(1, counts, 60)[0] == "failed"
    assert dc.pytest_status(None, None, 60)[0] == "timeout"
    all_skipped = {"passed": 0, "failed": 0, "skipped": 3, "errors": 0}
    assert dc.pytest_status(0, all_skipped, 60)[0] == "failed"
    some_skipped = {"passed": 2, "failed": 0, "skipped": 1, "errors": 0,
                    "skip_reasons": {"no device": 1}}
    assert dc.pytest_status(0, some_skipped, 60) == ("passed", "")
    assert dc.pytest_status(0, some_skipped, 60, skips_fail=True)[0] == "failed"


def test_exit_code():
    ran_ok = {"a": {"status": "passed"}, "b": {"status": "skipped"}, "c": {"status": "missing"},
              "d": {"status": "not_run"}}
    assert dc.exit_code(ran_ok) == 0
    for bad in ("failed", "error", "timeout"):
        assert dc.exit_code(dict(ran_ok, e={"status": bad})) == 1


def test_out_parent_missing(tmp_path):
    res = subprocess.run([sys.executable, str(TOOL), "--standin", "--out",
                          str(tmp_path / "no" / "such")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert "parent directory" in res.stderr and "does not exist" in res.stderr
