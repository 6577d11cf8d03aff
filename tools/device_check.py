"""One-shot device check: refbayes on an NVIDIA GPU with CuPy installed, no network, one call.

    python tools/device_check.py --out DIR [--wheels DIR] [--standin] [--quick] [--budget-s 420]

Run from anywhere (the repository root is put on sys.path and on the subprocesses' PYTHONPATH;
refbayes need not be installed). Every step is bounded by the budget (``--budget-s``, default 420
s, for a device call of at most 8 minutes): each gets a timeout from what is left, and once the
budget is spent the remaining steps are recorded as ``not_run``. ``DIR/device_check.json`` is
rewritten (temp file + os.replace) after every step, and every few seconds while a subprocess
runs, so a run cut short still leaves its results.

Steps (each recorded under ``steps`` in the JSON with a status: passed, failed, error, timeout,
skipped, missing, not_run):

1. install: with ``--wheels DIR``, ``pip install --no-index --find-links DIR`` every ``*.whl`` in
   DIR (a CUDA 13 image has CuPy 14, NumPy 2, SciPy, numba, pytest, hypothesis and torch, but not
   autograd: give the check autograd's wheel). Then the modules the tests need (autograd, numba,
   pytest, hypothesis) are looked up; a missing one fails this step, by name, and the later steps
   run where they can (without pytest, steps 3 and 4 are not run).
2. versions: Python, NumPy, SciPy, CuPy, numba, autograd and torch versions, the CUDA runtime and
   driver versions and the card (name, memory, compute capability) from ``cupy.cuda.runtime``,
   and ``nvidia-smi -L`` where it exists.
3. gpu_tests: ``python -m pytest -m gpu -q -p no:cacheprovider --junitxml=DIR/gpu-tests.xml``
   with ``REFBAYES_HYPOTHESIS_PROFILE=gpu``, in a subprocess with a timeout; the junit XML gives
   passed / failed / skipped / errors, the failures' names and the skip reasons. A run whose
   every test skipped (CuPy or the device not visible to pytest) fails. ``--quick`` runs the gpu
   tests of QUICK_GPU_TESTS only (CI runs the whole gpu suite separately).
4. smoke: ``python -m pytest tests/test_gpu_smoke.py -m gpu`` the same way (DIR/smoke.xml):
   three steps of every method on device arrays equal the NumPy run. Here a skipped test fails
   the step (each case must have run on the device); ``missing`` when the file is not there.
5. benchmarks (a subprocess of this script): every asv benchmark class in
   ``asv_benchmarks/benchmarks/`` with a backend parameter that has "cupy", each parameter
   combination whose backend is "cupy" at its benchmark size: ``setup`` (NotImplementedError:
   skipped, with its message), one warm-up call of each ``time_*`` method, then the median of up
   to REPEATS timed calls, each between two ``cupy.cuda.Device().synchronize()`` (fewer when the
   budget is short; ``--quick``: one call, and only the first combination of each class that
   setup does not skip). Then the NumPy case of the same combination, set up and timed once, for
   ``ratio = numpy s / cupy s``. Classes are visited round-robin, one combination per turn, so a
   short budget still covers every class. Each case has a time limit (CASE_LIMIT_S; a call
   already inside a library routine finishes first).
   torch (step "torch", another subprocess; skipped with its reason with ``--standin``, without
   torch or without CUDA): per-example gradients at the sizes of
   bench_per_example.PerExampleGradsBackend (MLP [8, width, 1], ReLU, Gaussian; width x M) by
   ``torch.func.vmap(torch.func.grad(loss))`` against refbayes' CuPy ``per_example_grads``
   (vectorized); and one ``torch.optim.Adam`` step of a flat (D,) parameter with its gradient
   set, against ``refbayes.methods.adam.adam_update`` on CuPy (checked, and inside
   ``refbayes.unchecked()``), at the D of bench_bnn's MLP and of bench_noisy_kfac's. Each pair
   is checked to agree to EXACT_F64 (a disagreement fails the step) before both are timed the
   same way; ``refbayes_over_torch`` is refbayes s / torch s. ``--quick``: the first of each.
6. report: DIR/device_check.json (versions, card, steps, counts, each failing test's message,
   the timing table, wall seconds, budget) and DIR/device_check.txt (the same, readable), also
   printed to stdout. The steps' own files (logs, junit XML, jsonl rows) are then moved into
   one archive, DIR/raw-logs.tar.gz, so DIR ends with three files.

The memory-bandwidth floor. Bandwidth = 2 * 256 MiB / t: t the median time of a device-to-device
copy of a 256 MiB float64 array (``cupy.copyto`` into a preallocated array, timed by CUDA events),
which reads 256 MiB and writes 256 MiB. The bytes rule (BYTES_RULE): the bytes an operation must
move are taken as

    bytes = sum of nbytes of the device arrays reachable from the instance attributes that the
            timed method reads (inputs, each read once)
          + sum of nbytes of the device arrays returned by the instance's callables that it calls
            (outputs, each written once), not counting arrays that are also inputs;

each array object counted once (a view counts its own nbytes). The attributes read and the
values returned are recorded during the warm-up call (the instance's class is swapped for a
subclass whose ``__getattribute__`` records them); attributes are followed through containers,
named tuples, closures and partials. ``floor s = bytes / bandwidth``, ``cupy/floor`` its ratio
to the measured time. Where the timed method reads no device array through the instance the
floor is null, not guessed. The floor is an estimate, not a bound: a method that reads only part
of an array it reaches (an in-place update of one row) is charged the whole array; outputs that
no instance callable returns (most ``time_*`` call module functions and drop the result) are not
counted; and arrays small enough to stay in the GPU's L2 cache move faster than the probe's
256 MiB, so cupy/floor < 1 can happen for small cases. In ``--standin`` mode the probe is the
stand-in's copy on the host and every number of step 5 is NumPy behind the stand-in: it means
nothing about a GPU (the JSON says ``timings_meaningful: false``).

``--standin`` (a dry run for CI on a CPU): ``tests/standin`` goes first on sys.path before cupy is
imported (the stand-in is asserted), and the subprocesses get ``REFBAYES_CUPY_STANDIN=1``, so every
step runs against the CuPy stand-in. ``--standin --quick`` finishes in well under a minute on two
cores.

Exit status: 0 when every step that ran passed (skipped, missing and not-run steps do not fail
the run), 1 otherwise; 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import itertools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
import types
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDIN_DIR = REPO / "tests" / "standin"
BENCH_ROOT = REPO / "asv_benchmarks"
SMOKE_TEST = "tests/test_gpu_smoke.py"
QUICK_GPU_TESTS = ["tests/test_backend.py", "tests/linalg/test_lowrank.py"]

STEPS = ("install", "versions", "gpu_tests", "smoke", "benchmarks", "torch", "report")
FAILING = frozenset({"failed", "error", "timeout"})
NEEDED_MODULES = ("autograd", "numba", "pytest", "hypothesis")
VERSION_MODULES = ("numpy", "scipy", "cupy", "numba", "autograd", "pytest", "hypothesis")

COPY_BYTES = 256 * 2**20     # the bandwidth probe: one 256 MiB float64 array
COPY_REPEATS = 5
REPEATS = 5                  # timed calls per case (median), fewer when the budget is short
CASE_LIMIT_S = {"quick": 30.0, "full": 60.0}   # per benchmark case (cupy and numpy each)
REPEAT_WINDOW_S = 5.0        # a case stops repeating once its repeats took this long
MIN_STEP_S = 10.0            # a step is not started with less budget than this
MIN_CASE_S = 3.0             # nor a benchmark case with less than this
MARGIN_S = 8.0               # kept for the report at the end
TORCH_RESERVE_S = 60.0       # kept for the torch comparison when torch is installed
WORKER_GRACE_S = 15.0        # a worker past its own deadline by this much is killed
SHARES = {"gpu_tests": 0.45, "smoke": 0.35}    # of the budget left when the step starts
MESSAGE_CHARS = 400          # of each failing test's message kept in the JSON
RAW_ARCHIVE = "raw-logs.tar.gz"  # the steps' logs, XMLs and jsonl, bundled at the end
TAIL_CHARS = 3000

BYTES_RULE = ("bytes = nbytes of the device arrays reachable from the instance attributes the "
              "timed method reads (inputs, read once) + nbytes of the device arrays returned by "
              "the instance's callables it calls, not also inputs (outputs, written once); each "
              "array object once; floor s = bytes / bandwidth; null where no device array is "
              "read through the instance")
BANDWIDTH_RULE = ("bandwidth = 2 * 256 MiB / t, t the median time of a device-to-device copy of "
                  "a 256 MiB float64 array (256 MiB read + 256 MiB written), CUDA events")


# ----------------------------------------------------------------------------- small helpers

def copy_bandwidth(nbytes: int, seconds: float) -> float:
    """Bytes per second moved by a copy of ``nbytes`` taking ``seconds``: it reads and writes."""
    if not (nbytes > 0 and seconds > 0):
        raise ValueError(f"nbytes, seconds: expected both > 0, got {nbytes}, {seconds}")
    return 2.0 * nbytes / seconds


def floor_seconds(nbytes: int | None, bandwidth: float | None) -> float | None:
    """The time ``nbytes`` take at ``bandwidth`` bytes/s; None when either is unknown or 0."""
    if not nbytes or not bandwidth:
        return None
    return nbytes / bandwidth


def safe_ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is unknown or b is 0."""
    if a is None or not b:
        return None
    return a / b


def median_or_none(xs):
    return statistics.median(xs) if xs else None


def tail(text: str, n: int = TAIL_CHARS) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def error_text(err: BaseException) -> str:
    """The exception's type, message and the last frames of its traceback."""
    frames = traceback.format_exception(type(err), err, err.__traceback__)
    return tail("".join(frames), 1500)


def jsonable(obj):
    """json.dumps ``default``: NumPy scalars to Python, anything else to its repr."""
    item = getattr(obj, "item", None)
    if callable(item) and getattr(obj, "shape", None) == ():
        return item()
    return repr(obj)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and os.replace (never half written)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1, default=jsonable) + "\n")


def exit_code(steps: dict) -> int:
    """0 when every step that ran passed (skipped / missing / not_run do not count), else 1."""
    return 1 if any(s.get("status") in FAILING for s in steps.values()) else 0


def prepare_out(path: str) -> Path:
    """``--out``: an existing directory, or a new one whose parent exists (a clear error else)."""
    out = Path(path).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {path}: exists and is not a directory")
    if not out.exists():
        if not out.parent.is_dir():
            raise ValueError(f"--out {path}: parent directory {out.parent} does not exist; "
                             "create it first")
        out.mkdir()
    return out


def log(msg: str) -> None:
    print(f"[device_check] {msg}", file=sys.stderr, flush=True)


class Budget:
    """Seconds left of ``total`` since construction."""

    def __init__(self, total: float):
        self.total = float(total)
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.total - self.elapsed()


# ----------------------------------------------------------------------------- subprocesses

def subprocess_env(standin: bool) -> dict:
    """The environment of every subprocess: the repo root first on PYTHONPATH; the stand-in on
    (``REFBAYES_CUPY_STANDIN=1``) or explicitly off."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    if standin:
        env["REFBAYES_CUPY_STANDIN"] = "1"
    else:
        env.pop("REFBAYES_CUPY_STANDIN", None)
    return env


def run_bounded(cmd, env, timeout_s: float, log_path: Path, on_tick=None, tick_s: float = 5.0):
    """Run ``cmd`` in its own process group from the repo root, output to ``log_path``; kill the
    group at ``timeout_s``. Returns (returncode or None on timeout, wall seconds, output tail)."""
    t0 = time.monotonic()
    with open(log_path, "w") as logf:
        logf.write("$ " + " ".join(map(str, cmd)) + "\n")
        logf.flush()
        proc = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=env, stdout=logf,
                                stderr=subprocess.STDOUT, start_new_session=True)
        rc = None
        while True:
            left = timeout_s - (time.monotonic() - t0)
            if left <= 0:
                _kill_group(proc)
                break
            try:
                rc = proc.wait(timeout=min(tick_s, left))
                break
            except subprocess.TimeoutExpired:
                if on_tick is not None:
                    on_tick()
    wall = time.monotonic() - t0
    return rc, wall, tail(log_path.read_text(errors="replace"))


def _kill_group(proc) -> None:
    """SIGTERM, then SIGKILL, to the process group this script started for ``proc``."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ----------------------------------------------------------------------------- step 1: install

def missing_modules(names=NEEDED_MODULES) -> list[str]:
    importlib.invalidate_caches()
    return [m for m in names if importlib.util.find_spec(m) is None]


def step_install(wheels: str | None, out: Path, budget: Budget) -> dict:
    rec = {"wheels_dir": wheels}
    if wheels:
        wdir = Path(wheels).expanduser().resolve()
        files = sorted(wdir.glob("*.whl")) if wdir.is_dir() else []
        rec["wheels"] = [f.name for f in files]
        if not wdir.is_dir():
            rec.update(status="failed", reason=f"--wheels {wheels}: not a directory")
        elif not files:
            rec.update(status="failed", reason=f"--wheels {wheels}: no *.whl files in it")
        else:
            cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", wdir,
                   *files]
            timeout = min(180.0, budget.left() - MARGIN_S)
            rc, wall, out_tail = run_bounded(cmd, subprocess_env(False), timeout,
                                             out / "install.log")
            rec.update(returncode=rc, wall_s=round(wall, 2), output_tail=out_tail)
            if rc is None:
                rec.update(status="timeout", reason=f"pip install ran past {timeout:.0f} s")
            elif rc != 0:
                rec.update(status="failed", reason=f"pip install exited with {rc}")
    missing = missing_modules()
    rec["missing_modules"] = missing
    if "status" not in rec:
        if missing:
            rec.update(status="failed", reason="modules the tests need are not importable: "
                       + ", ".join(missing))
        elif wheels:
            rec["status"] = "passed"
        else:
            rec.update(status="skipped", reason="no --wheels given (the needed modules are "
                       "all importable)")
    elif missing:
        rec["reason"] += "; not importable: " + ", ".join(missing)
    return rec


# ----------------------------------------------------------------------------- step 2: versions

def import_cupy(standin: bool):
    """``cupy``: the stand-in of tests/standin (asserted) with ``standin``, else the real one
    (asserted not to be the stand-in)."""
    if standin and str(STANDIN_DIR) not in sys.path:
        sys.path.insert(0, str(STANDIN_DIR))
    import cupy
    if standin and not hasattr(cupy, "_standin"):
        raise RuntimeError(f"--standin: 'cupy' resolved to {cupy.__file__}, not the stand-in "
                           f"of {STANDIN_DIR}")
    if not standin and hasattr(cupy, "_standin"):
        raise RuntimeError(f"'cupy' resolved to the stand-in ({cupy.__file__}) without --standin")
    return cupy


def module_version(name: str) -> dict:
    """{"version": ...} of an importable module (its __version__, else its distribution's),
    else {"version": None, "error": ...} with the import's message."""
    try:
        mod = importlib.import_module(name)
    except Exception as err:  # recorded: an ImportError, or a failing import of an installed one
        return {"version": None, "error": f"{type(err).__name__}: {err}"}
    version = getattr(mod, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return {"version": str(version)}


def dist_version(name: str) -> dict:
    """The installed distribution's version without importing it (torch: seconds to import)."""
    try:
        return {"version": importlib.metadata.version(name), "importable":
                importlib.util.find_spec(name) is not None}
    except importlib.metadata.PackageNotFoundError:
        return {"version": None, "error": f"{name} is not installed"}


def card_info(cupy) -> dict:
    """Device 0's name, memory, compute capability; the CUDA runtime and driver versions."""
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props.get("name", b"")
    cc = (props.get("major"), props.get("minor"))
    return {
        "device_count": rt.getDeviceCount(),
        "name": name.decode(errors="replace") if isinstance(name, bytes) else str(name),
        "total_memory_bytes": props.get("totalGlobalMem"),
        "total_memory_gib": round(props.get("totalGlobalMem", 0) / 2**30, 2),
        "compute_capability": f"{cc[0]}.{cc[1]}",
        "multiprocessors": props.get("multiProcessorCount"),
        "cuda_runtime_version": rt.runtimeGetVersion(),
        "cuda_driver_version": rt.driverGetVersion(),
    }


def nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"available": False, "reason": "nvidia-smi not on PATH"}
    try:
        res = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return {"available": True, "error": "nvidia-smi -L ran past 20 s"}
    return {"available": True, "returncode": res.returncode,
            "lines": res.stdout.strip().splitlines(), "stderr": tail(res.stderr, 500)}


def step_versions(result: dict, standin: bool) -> dict:
    versions = {"python": platform.python_version(), "platform": platform.platform()}
    for name in VERSION_MODULES:
        if name != "cupy":
            versions[name] = module_version(name)
    versions["torch"] = dist_version("torch")
    result["versions"] = versions
    log("versions: " + ", ".join(f"{k} {v.get('version') if isinstance(v, dict) else v}"
                                 for k, v in versions.items() if k != "platform"))
    result["nvidia_smi"] = nvidia_smi()
    try:
        cupy = import_cupy(standin)
        versions["cupy"] = {"version": cupy.__version__, "file": cupy.__file__}
        result["card"] = card = card_info(cupy)
        log(f"cupy {cupy.__version__}; card: {card['name']}, {card['total_memory_gib']} GiB, "
            f"compute capability {card['compute_capability']}, CUDA runtime "
            f"{card['cuda_runtime_version']}, driver {card['cuda_driver_version']}")
    except Exception as err:  # recorded: no CuPy, no driver, no device; later steps still run
        versions.setdefault("cupy", {"version": None})
        versions["cupy"]["error"] = error_text(err)
        return {"status": "failed", "reason": f"CuPy or the device: {type(err).__name__}: {err}"}
    return {"status": "passed"}


# ----------------------------------------------------------------------------- steps 3, 4: pytest

def failure_message(element) -> str:
    """The first line of a junit failure / error (its ``message``, else its text), at most
    MESSAGE_CHARS characters: what failed, in the JSON, without the raw logs."""
    text = element.get("message") or (element.text or "").strip()
    first = text.splitlines()[0] if text else ""
    return first[:MESSAGE_CHARS]


def bundle_raw(out: Path) -> dict:
    """Move every file of ``out`` but the report (device_check.json / .txt) into one archive,
    RAW_ARCHIVE: the logs, junit XMLs and jsonl rows of the steps (their content is already
    summarised in the JSON). ``out`` then holds three files, so a transfer that brings back
    only a few files (the device machines of some workplaces return 8) loses none of them."""
    keep = {"device_check.json", "device_check.txt", RAW_ARCHIVE}
    raw = sorted(p for p in out.iterdir() if p.is_file() and p.name not in keep)
    if not raw:
        return {"archive": None, "files": []}
    tmp = out / (RAW_ARCHIVE + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in raw:
            tar.add(p, arcname=p.name)
    os.replace(tmp, out / RAW_ARCHIVE)
    for p in raw:
        p.unlink()
    return {"archive": RAW_ARCHIVE, "files": [p.name for p in raw]}


def junit_counts(path: Path) -> dict:
    """passed / failed / skipped / errors, the failing tests' ids and their messages
    (``failure_messages``, id -> first line) from a pytest junit XML."""
    root = ET.parse(path).getroot()
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failures, messages, skip_reasons = [], {}, collections.Counter()
    for case in root.iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        kinds = {child.tag: child for child in case}
        if "error" in kinds:
            counts["errors"] += 1
            failures.append(test_id)
            messages[test_id] = failure_message(kinds["error"])
        elif "failure" in kinds:
            counts["failed"] += 1
            failures.append(test_id)
            messages[test_id] = failure_message(kinds["failure"])
        elif "skipped" in kinds:
            counts["skipped"] += 1
            skip_reasons[kinds["skipped"].get("message", "")] += 1
        else:
            counts["passed"] += 1
    counts["failures"] = failures
    counts["failure_messages"] = messages
    counts["skip_reasons"] = dict(skip_reasons)
    return counts


def pytest_status(rc: int | None, counts: dict | None, timeout_s: float,
                  skips_fail: bool = False) -> tuple[str, str]:
    """(status, reason) of a pytest run from its exit code and junit counts; with
    ``skips_fail`` (the smoke test, which must run every case on the device) a skip fails."""
    if rc is None:
        return "timeout", f"pytest ran past its {timeout_s:.0f} s timeout (killed)"
    if counts is None:
        return "failed", f"pytest exited with {rc} and wrote no junit XML"
    n = counts["passed"] + counts["failed"] + counts["skipped"] + counts["errors"]
    if rc == 5 or n == 0:
        return "failed", "no tests collected"
    if counts["failed"] or counts["errors"] or rc != 0:
        return "failed", (f"{counts['failed']} failed, {counts['errors']} errors "
                          f"(pytest exit {rc})")
    if counts["passed"] == 0:
        return "failed", "every test was skipped: CuPy or the device is not visible to pytest"
    if skips_fail and counts["skipped"]:
        first = next(iter(counts.get("skip_reasons") or {"": 0}))
        return "failed", f"{counts['skipped']} test(s) skipped, e.g. {first!r}"
    return "passed", ""


def step_pytest(name: str, paths: list[str], out: Path, budget: Budget, standin: bool,
                share: float, note: str = "") -> dict:
    xml = out / f"{'gpu-tests' if name == 'gpu_tests' else name}.xml"
    if xml.exists():
        xml.unlink()
    cmd = [sys.executable, "-m", "pytest", *paths, "-m", "gpu", "-q", "-p", "no:cacheprovider",
           f"--junitxml={xml}"]
    env = subprocess_env(standin)
    env["REFBAYES_HYPOTHESIS_PROFILE"] = "gpu"
    timeout = max(MIN_STEP_S, share * (budget.left() - MARGIN_S))
    log(f"{name}: {' '.join(cmd[2:])} (timeout {timeout:.0f} s)")
    rc, wall, out_tail = run_bounded(cmd, env, timeout, out / f"{xml.stem}.log")
    counts = None
    rec = {"command": " ".join(map(str, cmd)), "returncode": rc, "wall_s": round(wall, 2),
           "timeout_s": round(timeout, 1), "junit_xml": str(xml), "output_tail": out_tail}
    if note:
        rec["note"] = note
    if xml.exists():
        try:
            counts = junit_counts(xml)
        except ET.ParseError as err:
            rec["junit_error"] = f"ParseError: {err}"
    if counts is not None:
        rec["counts"] = {k: v for k, v in counts.items()
                         if k not in ("failures", "failure_messages", "skip_reasons")}
        rec["failures"] = counts["failures"]
        rec["failure_messages"] = counts["failure_messages"]
        rec["skip_reasons"] = counts["skip_reasons"]
    rec["status"], rec["reason"] = pytest_status(rc, counts, timeout, skips_fail=name == "smoke")
    return rec


# ------------------------------------------------------------------ the bytes an operation moves

_WRAPPABLE = (types.FunctionType, types.MethodType, functools.partial)
_ATOMS = (str, bytes, int, float, complex, bool, type(None), types.ModuleType, type)
MAX_DEPTH = 6


def device_arrays(obj, is_device, found: dict | None = None, seen: set | None = None,
                  depth: int = 0) -> dict:
    """{id: array} of the device arrays reachable from ``obj``: through containers (named tuples
    included), dict values, partials, closures and plain objects' attributes (not modules,
    classes or the instance behind a bound method), to MAX_DEPTH levels."""
    found = {} if found is None else found
    seen = set() if seen is None else seen
    if depth > MAX_DEPTH or isinstance(obj, _ATOMS) or id(obj) in seen:
        return found
    seen.add(id(obj))
    if is_device(obj):
        found[id(obj)] = obj
        return found
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        children = list(obj)
    elif isinstance(obj, functools.partial):
        children = [obj.func, obj.args, obj.keywords]
    elif isinstance(obj, types.FunctionType):
        children = [_cell(c) for c in (obj.__closure__ or ())]
    elif isinstance(obj, types.MethodType):
        children = [obj.__func__]
    elif hasattr(obj, "__dict__"):
        children = list(vars(obj).values())
    else:
        return found
    for child in children:
        device_arrays(child, is_device, found, seen, depth + 1)
    return found


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell (a closure variable not yet assigned)
        return None


def traced_call(bench, method: str, args: tuple) -> tuple[set, list]:
    """Call ``bench.<method>(*args)`` once; return (names of the instance attributes read, values
    returned by the instance's callables called), recorded by swapping the instance's class for
    a subclass whose ``__getattribute__`` logs names and wraps callables."""
    cls = type(bench)
    names, returned = set(), []

    def wrap(fn):
        def wrapper(*a, **k):
            out = fn(*a, **k)
            returned.append(out)
            return out
        return wrapper

    def __getattribute__(self, name):
        value = super(traced, self).__getattribute__(name)
        if not name.startswith("__"):
            names.add(name)
            if isinstance(value, _WRAPPABLE):
                value = wrap(value)
        return value

    traced = type(cls.__name__, (cls,), {"__getattribute__": __getattribute__,
                                         "__module__": cls.__module__})
    bench.__class__ = traced
    try:
        getattr(bench, method)(*args)
    finally:
        bench.__class__ = cls
    return names, returned


def bytes_moved(bench, names: set, returned: list, is_device) -> dict:
    """The bytes rule (BYTES_RULE) for one traced call: inputs, outputs and their sum."""
    state = vars(bench)
    inputs: dict = {}
    seen = {id(bench)}  # a closure over the instance must not bring in what it does not read
    for name in sorted(names):
        if name in state:
            device_arrays(state[name], is_device, inputs, seen)
    outputs = {k: a for k, a in device_arrays(returned, is_device, seen={id(bench)}).items()
               if k not in inputs}
    b_in = sum(int(a.nbytes) for a in inputs.values())
    b_out = sum(int(a.nbytes) for a in outputs.values())
    return {"bytes_in": b_in, "bytes_out": b_out, "n_in": len(inputs), "n_out": len(outputs),
            "bytes": (b_in + b_out) if inputs else None}


# ----------------------------------------------------------------------------- benchmark discovery

def benchmark_classes() -> list[tuple[str, str, type]]:
    """(module, class name, class) of every benchmark class in asv_benchmarks/benchmarks."""
    import pkgutil
    if str(BENCH_ROOT) not in sys.path:
        sys.path.insert(0, str(BENCH_ROOT))
    package = importlib.import_module("benchmarks")
    out = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name == "common":
            continue
        module = importlib.import_module(f"benchmarks.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and _time_methods(cls):
                out.append((info.name, name, cls))
    return out


def _time_methods(cls) -> list[str]:
    return sorted(m for m in dir(cls) if m.startswith("time_") and callable(getattr(cls, m)))


def param_lists(cls) -> tuple[list, list]:
    """(param_names, params) normalised as asv does (one parameter may be given unnested)."""
    params = getattr(cls, "params", None)
    names = list(getattr(cls, "param_names", []))
    if not params:
        return [], []
    if len(names) == 1 and not isinstance(params[0], (list, tuple)):
        params = (params,)
    return names, [list(p) for p in params]


def backend_index(cls) -> int | None:
    """Index of the backend parameter ("backend", or the one listing "numpy" and "cupy") when
    it has "cupy"; None otherwise."""
    names, params = param_lists(cls)
    for i, values in enumerate(params):
        named = i < len(names) and names[i] == "backend"
        if "cupy" in values and (named or "numpy" in values):
            return i
    return None


def cupy_combos(cls) -> list[tuple]:
    """Every parameter combination whose backend is "cupy", in asv's order (small first)."""
    i = backend_index(cls)
    if i is None:
        return []
    return [c for c in itertools.product(*param_lists(cls)[1]) if c[i] == "cupy"]


def with_backend(combo: tuple, i: int, name: str) -> tuple:
    return combo[:i] + (name,) + combo[i + 1:]


def params_text(cls, combo: tuple) -> str:
    """'D=100 L=1': the combination without its backend."""
    names = param_lists(cls)[0]
    i = backend_index(cls)
    return " ".join(f"{n}={v}" for k, (n, v) in enumerate(zip(names, combo)) if k != i)


# ----------------------------------------------------------------------------- timing

class CaseTimeout(BaseException):
    """Raised by SIGALRM when a benchmark case runs past its limit (BaseException: no library
    ``except Exception`` can swallow it)."""


def _on_alarm(signum, frame):
    raise CaseTimeout()


class time_limit:
    """``with time_limit(s):`` raises CaseTimeout after s seconds (between Python bytecodes: a
    call already inside a C routine finishes first)."""

    def __init__(self, seconds: float):
        self.seconds = max(0.01, float(seconds))

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.old)
        return False


def timed_calls(fn, sync, repeats: int, window_s: float) -> list[float]:
    """Seconds of up to ``repeats`` calls of ``fn``, each between two ``sync()``; stops early
    once the calls took ``window_s`` in all."""
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if sum(times) >= window_s:
            break
    return times


class Worker:
    """What the benchmark and torch subprocesses share: the deadline, the rows file, cupy."""

    def __init__(self, args):
        self.deadline = args.deadline
        self.quick = args.quick
        self.rows_path = Path(args.rows)
        self.cupy = import_cupy(args.standin)
        self.repeats = 1 if args.quick else REPEATS
        self.case_limit = CASE_LIMIT_S["quick" if args.quick else "full"]

    def left(self) -> float:
        return self.deadline - time.time()

    def emit(self, row: dict) -> None:
        with open(self.rows_path, "a") as f:
            f.write(json.dumps(row, default=jsonable) + "\n")

    def sync(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def is_device(self, obj) -> bool:
        return isinstance(obj, self.cupy.ndarray)

    def limit(self) -> float:
        return min(self.case_limit, self.left())


def measure_bandwidth(cp, nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> dict:
    """Median device-to-device copy time of an ``nbytes`` float64 array (CUDA events)."""
    src = cp.ones(nbytes // 8, dtype=cp.float64)
    dst = cp.empty_like(src)
    cp.copyto(dst, src)  # warm-up: the kernel, the pages
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        cp.copyto(dst, src)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    t = statistics.median(times)
    return {"bytes_copied": nbytes, "seconds": t, "times_s": times,
            "bytes_per_s": copy_bandwidth(nbytes, t), "rule": BANDWIDTH_RULE}


def run_case(w: Worker, module: str, cname: str, cls, combo: tuple, bandwidth: float | None):
    """Rows of one cupy combination: setup, then per time_* method a traced warm-up, timed
    calls and the floor; then the NumPy case of the same combination, each method once."""
    base = {"kind": "row", "module": module, "class": cname,
            "params": dict(zip(param_lists(cls)[0], combo)), "params_text": params_text(cls, combo)}
    methods = _time_methods(cls)
    bench = cls()
    try:
        with time_limit(w.limit()):
            bench.setup(*combo)
            w.sync()
    except NotImplementedError as err:
        return [dict(base, method=None, status="skipped", reason=str(err).splitlines()[0])]
    except CaseTimeout:
        return [dict(base, method=None, status="timeout", reason="setup ran past "
                     f"{w.case_limit:.0f} s")]
    except Exception as err:  # recorded as the case's error: the step fails
        return [dict(base, method=None, status="error", error=error_text(err))]
    rows = []
    for method in methods:
        row = dict(base, method=method, benchmark=f"{module}.{cname}.{method}")
        if w.left() < MIN_CASE_S:
            rows.append(dict(row, status="not_reached", reason="budget exhausted"))
            continue
        try:
            with time_limit(w.limit()):
                w.sync()
                names, returned = traced_call(bench, method, combo)
                w.sync()
                moved = bytes_moved(bench, names, returned, w.is_device)
                del returned
                times = timed_calls(functools.partial(getattr(bench, method), *combo), w.sync,
                                    w.repeats, REPEAT_WINDOW_S)
        except CaseTimeout:
            rows.append(dict(row, status="timeout", reason=f"ran past {w.case_limit:.0f} s"))
            continue
        except Exception as err:  # recorded: the step fails
            rows.append(dict(row, status="error", error=error_text(err)))
            continue
        cupy_s = statistics.median(times)
        floor = floor_seconds(moved["bytes"], bandwidth)
        rows.append(dict(row, status="timed", cupy_s=cupy_s, cupy_times_s=times, **moved,
                         floor_s=floor, cupy_over_floor=safe_ratio(cupy_s, floor)))
    del bench
    w.cupy.get_default_memory_pool().free_all_blocks()
    numpy_reference(w, cls, combo, rows)
    return rows


def numpy_reference(w: Worker, cls, combo: tuple, rows: list) -> None:
    """Fill numpy_s (one call after setup) and ratio = numpy s / cupy s into the timed rows."""
    timed = [r for r in rows if r["status"] == "timed"]
    if not timed:
        return
    np_combo = with_backend(combo, backend_index(cls), "numpy")
    if w.left() < MIN_CASE_S:
        for r in timed:
            r.update(numpy_status="not_reached", numpy_reason="budget exhausted")
        return
    bench = cls()
    try:
        with time_limit(w.limit()):
            bench.setup(*np_combo)
    except NotImplementedError as err:
        for r in timed:
            r.update(numpy_status="skipped", numpy_reason=str(err).splitlines()[0])
        return
    except CaseTimeout:
        for r in timed:
            r.update(numpy_status="timeout", numpy_reason=f"setup ran past {w.case_limit:.0f} s")
        return
    except Exception as err:  # the NumPy side of a benchmark failing: recorded, reported
        for r in timed:
            r.update(numpy_status="error", numpy_error=error_text(err))
        return
    for r in timed:
        if w.left() < MIN_CASE_S:
            r.update(numpy_status="not_reached", numpy_reason="budget exhausted")
            continue
        try:
            with time_limit(w.limit()):
                t = timed_calls(functools.partial(getattr(bench, r["method"]), *np_combo),
                                lambda: None, 1, 0.0)[0]
        except CaseTimeout:
            r.update(numpy_status="timeout", numpy_reason=f"ran past {w.case_limit:.0f} s")
            continue
        except Exception as err:  # recorded, reported
            r.update(numpy_status="error", numpy_error=error_text(err))
            continue
        r.update(numpy_status="timed", numpy_s=t, ratio=safe_ratio(t, r["cupy_s"]))


def class_cases(w: Worker, module: str, cname: str, cls, bandwidth):
    """Generator of the row lists of a class's cupy combinations, in order."""
    for combo in cupy_combos(cls):
        yield run_case(w, module, cname, cls, combo, bandwidth)


def worker_bench(args) -> int:
    """Step 5 in its own process: bandwidth, then the classes round-robin (one combination that
    setup does not skip per turn; --quick: one turn), rows appended to ``args.rows``."""
    w = Worker(args)
    try:
        bw = measure_bandwidth(w.cupy)
    except Exception as err:  # recorded; the floors become null
        bw = {"error": error_text(err), "bytes_per_s": None, "rule": BANDWIDTH_RULE}
    w.emit(dict(kind="bandwidth", **bw))
    classes = [(m, n, c) for m, n, c in benchmark_classes() if backend_index(c) is not None]
    w.emit({"kind": "plan", "classes": {f"{m}.{n}": len(cupy_combos(c)) for m, n, c in classes},
            "quick": w.quick})
    queue = collections.deque((m, n, class_cases(w, m, n, c, bw["bytes_per_s"]))
                              for m, n, c in classes)
    while queue and w.left() >= MIN_CASE_S:
        module, cname, gen = queue.popleft()
        exhausted = True
        for rows in gen:
            for row in rows:
                w.emit(row)
            if any(r["status"] != "skipped" for r in rows):
                exhausted = False
                break
            if w.left() < MIN_CASE_S:
                break
        if not exhausted and not w.quick:
            queue.append((module, cname, gen))
    w.emit({"kind": "done", "left_s": w.left()})
    return 0


# ----------------------------------------------------------------------------- torch comparison

def torch_mlp_loss(torch, sizes, noise_precision):
    """l_i(theta) of refbayes' MLP (ReLU hidden layers, linear last, Gaussian likelihood) for one
    example, on the flat layout of DESIGN.md: per layer W (n_in, n_out) row-major, then b."""
    def loss(theta, x, y):
        h, off = x, 0
        for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            W = theta[off:off + n_in * n_out].reshape(n_in, n_out)
            off += n_in * n_out
            b = theta[off:off + n_out]
            off += n_out
            h = h @ W + b
            if k < len(sizes) - 2:
                h = torch.relu(h)
        return 0.5 * noise_precision * torch.sum((y - h) ** 2)
    return loss


def torch_per_example_case(w: Worker, torch, device, width: int, M: int) -> dict:
    """refbayes' CuPy per_example_grads (vectorized) vs torch.func.vmap(grad) on the same
    inputs: agreement (EXACT_F64) and median seconds of each."""
    import numpy as np

    from benchmarks.common import regression_batch
    from refbayes._tolerances import EXACT_F64, rel_err
    from refbayes.models import MLP
    cp = w.cupy
    model = MLP([8, width, 1], activation="relu", likelihood="gaussian")
    theta = model.init_theta(np.random.default_rng(0))
    X, y = regression_batch(np, M)
    args_cp = (cp.asarray(theta), cp.asarray(X), cp.asarray(y))
    args_t = tuple(torch.as_tensor(a, device=device) for a in (theta, X, y))
    loss = torch_mlp_loss(torch, list(model.sizes), model.likelihood.noise_precision)
    per_example = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    G_ref = model.per_example_grads(*args_cp, impl="vectorized")
    G_t = per_example(*args_t)
    err = rel_err(G_t.cpu().numpy(), cp.asnumpy(G_ref))
    tsync = functools.partial(torch.cuda.synchronize, device) if device.type == "cuda" else (
        lambda: None)
    t_ref = timed_calls(lambda: model.per_example_grads(*args_cp, impl="vectorized"), w.sync,
                        w.repeats, REPEAT_WINDOW_S)
    t_torch = timed_calls(lambda: per_example(*args_t), tsync, w.repeats, REPEAT_WINDOW_S)
    return {"case": "per_example_grads", "params_text": f"width={width} M={M} D={model.D}",
            "refbayes": "MLP.per_example_grads(impl='vectorized') on CuPy",
            "torch": "torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))",
            "rel_err": err, "agrees": err <= EXACT_F64, "refbayes_s": median_or_none(t_ref),
            "torch_s": median_or_none(t_torch),
            "refbayes_over_torch": safe_ratio(median_or_none(t_ref), median_or_none(t_torch))}


def torch_adam_case(w: Worker, torch, device, label: str, D: int) -> list[dict]:
    """refbayes.methods.adam.adam_update on CuPy (checked, and unchecked) vs one
    torch.optim.Adam step on a flat (D,) parameter with its .grad set; the first update from
    zero moments is compared (EXACT_F64) before timing."""
    import numpy as np

    import refbayes
    from refbayes._tolerances import EXACT_F64, rel_err
    from refbayes.methods import adam
    cp = w.cupy
    cfg = adam.AdamConfig()
    g = np.random.default_rng(0).standard_normal(D)
    g_cp = cp.asarray(g)
    state = adam.adam_init(g_cp)

    def new_param():
        p = torch.zeros(D, dtype=torch.float64, device=device, requires_grad=True)
        p.grad = torch.as_tensor(g, device=device)
        return p, torch.optim.Adam([p], lr=cfg.alpha, betas=(cfg.beta1, cfg.beta2),
                                   eps=cfg.eps_adam)

    p, opt = new_param()
    opt.step()
    delta, _ = adam.adam_update(g_cp, state, cfg)
    err = rel_err(p.detach().cpu().numpy(), cp.asnumpy(delta))
    p, opt = new_param()
    tsync = functools.partial(torch.cuda.synchronize, device) if device.type == "cuda" else (
        lambda: None)
    opt.step()  # warm-up
    t_torch = median_or_none(timed_calls(opt.step, tsync, w.repeats, REPEAT_WINDOW_S))

    def unchecked():
        with refbayes.unchecked():
            adam.adam_update(g_cp, state, cfg)

    rows = []
    for variant, fn in (("checked", lambda: adam.adam_update(g_cp, state, cfg)),
                        ("unchecked", unchecked)):
        fn()  # warm-up: kernels
        t_ref = median_or_none(timed_calls(fn, w.sync, w.repeats, REPEAT_WINDOW_S))
        rows.append({"case": "adam_step", "params_text": f"{label} D={D} {variant}",
                     "refbayes": f"adam.adam_update on CuPy ({variant})",
                     "torch": "torch.optim.Adam([p]).step() (default implementation)",
                     "rel_err": err, "agrees": err <= EXACT_F64, "refbayes_s": t_ref,
                     "torch_s": t_torch, "refbayes_over_torch": safe_ratio(t_ref, t_torch)})
    return rows


def torch_cases(quick: bool) -> list[tuple]:
    """(kind, args) of the torch comparison: the per-example benchmark's (width, M), and Adam at
    the D of bench_bnn's MLP and of bench_noisy_kfac's; --quick: the first of each."""
    from benchmarks.bench_bnn import model as bnn_model
    from benchmarks.bench_noisy_kfac import model as nk_model
    from benchmarks.bench_per_example import PerExampleGradsBackend
    _, widths, Ms = PerExampleGradsBackend.params
    per_example = [("per_example_grads", (w_, M)) for w_ in widths for M in Ms]
    adam_ = [("adam_step", ("bench_bnn MLP [8, 50, 1]", bnn_model().D)),
             ("adam_step", ("bench_noisy_kfac MLP [50, 400, 400, 10]", nk_model().D))]
    return per_example[:1] + adam_[:1] if quick else per_example + adam_


def torch_device(torch):
    """(device, info) of CUDA device 0; (None, the reason) when torch sees none."""
    if not torch.cuda.is_available():
        return None, (f"torch {torch.__version__} sees no CUDA device (built for CUDA "
                      f"{torch.version.cuda})")
    device = torch.device("cuda", 0)
    return device, {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                    "device": torch.cuda.get_device_name(device)}


def worker_torch(args) -> int:
    """The torch comparison in its own process; rows appended to ``args.rows``."""
    w = Worker(args)
    if str(BENCH_ROOT) not in sys.path:
        sys.path.insert(0, str(BENCH_ROOT))
    try:
        import torch
    except Exception as err:  # not installed, or a broken install: recorded as the skip reason
        w.emit({"kind": "skip", "reason": f"torch not importable: {type(err).__name__}: {err}"})
        return 0
    device, info = torch_device(torch)
    if device is None:
        w.emit({"kind": "skip", "reason": info})
        return 0
    w.emit(dict(kind="info", **info))
    for kind, case_args in torch_cases(w.quick):
        if w.left() < MIN_CASE_S:
            w.emit({"kind": "row", "case": kind, "status": "not_reached",
                    "params_text": str(case_args)})
            continue
        try:
            with time_limit(w.limit()):
                if kind == "per_example_grads":
                    rows = [torch_per_example_case(w, torch, device, *case_args)]
                else:
                    rows = torch_adam_case(w, torch, device, *case_args)
        except CaseTimeout:
            rows = [{"case": kind, "params_text": str(case_args), "status": "timeout"}]
        except Exception as err:  # recorded: the step fails
            rows = [{"case": kind, "params_text": str(case_args), "status": "error",
                     "error": error_text(err)}]
        for row in rows:
            row.setdefault("status", "timed" if row["agrees"] else "disagrees")
            w.emit(dict(kind="row", **row))
    w.emit({"kind": "done"})
    return 0


# ----------------------------------------------------------------------------- steps 5: parent side

def read_rows(path: Path) -> tuple[list[dict], int]:
    """(records, undecodable lines) of a worker's JSON-lines file (a killed worker may leave a
    half-written last line)."""
    if not path.exists():
        return [], 0
    recs, bad = [], 0
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            bad += 1
    return recs, bad


def merge_bench(result: dict, recs: list[dict]) -> dict:
    """Put the benchmark worker's records into ``result``; return the step's counts."""
    rows = [{k: v for k, v in r.items() if k != "kind"} for r in recs if r.get("kind") == "row"]
    result["timings"] = rows
    for r in recs:
        if r.get("kind") == "bandwidth":
            result["bandwidth"] = {k: v for k, v in r.items() if k != "kind"}
    plan = next((r for r in recs if r.get("kind") == "plan"), None)
    counts = collections.Counter(r["status"] for r in rows)
    out = {"timed": counts["timed"], "skipped": counts["skipped"], "errors": counts["error"],
           "timeouts": counts["timeout"], "not_reached_methods": counts["not_reached"]}
    if plan:
        done = collections.Counter(c for c, _ in {(f"{r['module']}.{r['class']}", r["params_text"])
                                                  for r in rows})
        out["classes"] = len(plan["classes"])
        if not plan.get("quick"):
            out["combinations_not_reached"] = sum(max(0, n - done[c])
                                                  for c, n in plan["classes"].items())
    return out


def run_worker(kind: str, args, out: Path, budget: Budget, reserve: float,
               on_update) -> tuple[int | None, float, str, list[dict], int]:
    """Run ``this script --worker kind`` with a deadline of the budget left minus ``reserve``."""
    rows_path = out / f"{kind}.jsonl"
    if rows_path.exists():
        rows_path.unlink()
    left = budget.left() - MARGIN_S - WORKER_GRACE_S  # the kill time stays inside the budget
    seconds = min(left, max(MIN_STEP_S, left - reserve))
    deadline = time.time() + seconds
    cmd = [sys.executable, Path(__file__).resolve(), "--worker", kind, "--out", out,
           "--rows", rows_path, "--deadline", f"{deadline:.3f}"]
    cmd += ["--standin"] if args.standin else []
    cmd += ["--quick"] if args.quick else []
    log(f"{kind}: worker with {seconds:.0f} s")

    def tick():
        on_update(read_rows(rows_path)[0])

    rc, wall, out_tail = run_bounded(cmd, subprocess_env(args.standin), seconds + WORKER_GRACE_S,
                                     out / f"{kind}.log", on_tick=tick)
    recs, bad = read_rows(rows_path)
    return rc, wall, out_tail, recs, bad


def step_benchmarks(args, out: Path, budget: Budget, result: dict, save) -> dict:
    reserve = TORCH_RESERVE_S if (not args.standin and importlib.util.find_spec("torch")) else 0.0

    def update(recs):
        merge_bench(result, recs)
        save()

    rc, wall, out_tail, recs, bad = run_worker("benchmarks", args, out, budget, reserve, update)
    counts = merge_bench(result, recs)
    rec = {"returncode": rc, "wall_s": round(wall, 2), "counts": counts,
           "output_tail": out_tail, "undecodable_lines": bad,
           "timings_meaningful": not args.standin, "bytes_rule": BYTES_RULE}
    errors = [f"{r['module']}.{r['class']}.{r.get('method')} [{r['params_text']}]"
              for r in result["timings"] if r["status"] == "error"]
    rec["error_cases"] = errors
    bw = result.get("bandwidth", {})
    fatal = next((r for r in recs if r.get("kind") == "fatal"), None)
    failure = worker_failure("benchmark", rc, fatal)
    if failure:
        rec.update(failure)
    elif errors:
        rec.update(status="failed", reason=f"{len(errors)} benchmark case(s) raised")
    elif "error" in bw:
        rec.update(status="failed", reason="the bandwidth probe raised")
    else:
        rec.update(status="passed", reason="")
    return rec


def worker_failure(name: str, rc: int | None, fatal: dict | None) -> dict | None:
    """status, reason (and error) of a worker killed at its deadline or exiting with an error;
    None when it ran to its end."""
    if rc is None:
        return {"status": "timeout", "reason": f"the {name} worker ran past its deadline (killed)"}
    if rc == 0 and not fatal:
        return None
    failure = {"status": "failed", "reason": f"the {name} worker exited with {rc}"
               + (f": {last_line(fatal['error'])}" if fatal else "")}
    if fatal:
        failure["error"] = fatal["error"]
    return failure


def step_torch(args, out: Path, budget: Budget, result: dict, save) -> dict:
    def update(recs):
        result["torch"] = [{k: v for k, v in r.items() if k != "kind"} for r in recs
                           if r.get("kind") == "row"]
        save()

    rc, wall, out_tail, recs, bad = run_worker("torch", args, out, budget, 0.0, update)
    update(recs)
    rec = {"returncode": rc, "wall_s": round(wall, 2), "output_tail": out_tail}
    info = next((r for r in recs if r.get("kind") == "info"), None)
    if info:
        rec["torch"] = {k: v for k, v in info.items() if k != "kind"}
    skip = next((r for r in recs if r.get("kind") == "skip"), None)
    bad_rows = [r for r in result["torch"] if r["status"] in ("error", "disagrees")]
    fatal = next((r for r in recs if r.get("kind") == "fatal"), None)
    failure = worker_failure("torch", rc, fatal)
    if failure:
        rec.update(failure)
    elif skip:
        rec.update(status="skipped", reason=skip["reason"])
    elif bad_rows:
        rec.update(status="failed", reason=f"{len(bad_rows)} torch case(s) raised or disagreed")
    else:
        rec.update(status="passed", reason="")
    return rec


# ----------------------------------------------------------------------------- step 6: report

def last_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""


def fmt(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def timing_table(rows: list[dict]) -> list[str]:
    """The timed (and timed-out / failing) rows as text; skipped combinations summarised per
    class."""
    head = (f"{'benchmark':<56} {'params':<42} {'cupy s':>9} {'numpy s':>9} {'ratio':>7} "
            f"{'floor s':>9} {'cupy/floor':>10}")
    lines = [head, "-" * len(head)]
    skipped = collections.defaultdict(list)
    for r in sorted(rows, key=lambda r: (r["module"], r["class"])):  # stable: combination order
        name = f"{r['module']}.{r['class']}.{r.get('method') or '(setup)'}"
        if r["status"] == "skipped":
            skipped[f"{r['module']}.{r['class']}"].append(r.get("reason", ""))
            continue
        if r["status"] != "timed":
            detail = r.get("reason") or last_line(r.get("error"))
            lines.append(f"{name:<56} {r['params_text']:<42} {r['status'].upper()}: {detail}")
            continue
        np_s = fmt(r.get("numpy_s")) if r.get("numpy_status") == "timed" else (
            r.get("numpy_status") or "-")
        lines.append(f"{name:<56} {r['params_text']:<42} {fmt(r['cupy_s']):>9} {np_s:>9} "
                     f"{fmt(r.get('ratio')):>7} {fmt(r.get('floor_s')):>9} "
                     f"{fmt(r.get('cupy_over_floor')):>10}")
    if skipped:
        lines.append("")
        lines.append("cupy combinations skipped by setup (NotImplementedError):")
        for cname, reasons in skipped.items():
            lines.append(f"  {cname}: {len(reasons)} skipped: "
                         + "; ".join(sorted(set(reasons))))
    return lines


def text_report(result: dict) -> str:
    mode = result["mode"]
    card = result.get("card") or {}
    v = result.get("versions") or {}
    lines = ["refbayes device check", "=" * 21]
    what = "standin (the CuPy stand-in on the CPU: timings MEANINGLESS)" if mode["standin"] \
        else "device"
    lines.append(f"mode: {what}{', quick' if mode['quick'] else ''}; budget "
                 f"{result['budget_s']:.0f} s, wall {result.get('wall_s', 0):.1f} s")
    if card:
        lines.append(f"card: {card.get('name')} ({card.get('total_memory_gib')} GiB, compute "
                     f"capability {card.get('compute_capability')}, {card.get('device_count')} "
                     f"device(s)); CUDA runtime {card.get('cuda_runtime_version')}, driver "
                     f"{card.get('cuda_driver_version')}")
    smi = result.get("nvidia_smi") or {}
    for line in smi.get("lines", []):
        lines.append(f"nvidia-smi: {line}")
    if v:
        parts = [f"python {v.get('python')}"]
        for name in ("numpy", "scipy", "cupy", "numba", "autograd", "torch", "pytest",
                     "hypothesis"):
            entry = v.get(name) or {}
            parts.append(f"{name} {entry.get('version') or 'MISSING'}")
        lines.append("versions: " + ", ".join(parts))
    lines += ["", "steps:"]
    for name, s in result["steps"].items():
        extra = s.get("reason") or ""
        c = s.get("counts")
        if c and name in ("gpu_tests", "smoke"):
            extra = (f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, "
                     f"{c['errors']} errors" + (f"; {extra}" if extra else ""))
        elif c and name == "benchmarks":
            extra = (", ".join(f"{k.replace('_', ' ')} {n}" for k, n in c.items())
                     + (f"; {extra}" if extra else ""))
        wall = f" ({s['wall_s']:.1f} s)" if "wall_s" in s else ""
        lines.append(f"  {name:<11} {s['status']:<8}{wall} {extra}".rstrip())
        messages = s.get("failure_messages") or {}
        for f in (s.get("failures") or [])[:20]:
            lines.append(f"      FAILED {f}" + (f": {messages[f]}" if messages.get(f) else ""))
    bw = result.get("bandwidth") or {}
    lines.append("")
    if bw.get("bytes_per_s"):
        lines.append(f"bandwidth: {bw['bytes_per_s'] / 1e9:.1f} GB/s ({BANDWIDTH_RULE})")
    elif bw:
        lines.append(f"bandwidth: not measured ({last_line(bw.get('error'))})")
    lines.append(f"floor: {BYTES_RULE}")
    lines.append("ratio = numpy s / cupy s (> 1: the device is faster); cupy/floor = cupy s / "
                 "floor s")
    if mode["standin"]:
        lines.append("(--standin: every time below is NumPy behind the CuPy stand-in; the numbers "
                     "are meaningless)")
    lines.append("")
    rows = result.get("timings") or []
    lines += timing_table(rows) if rows else ["(no benchmark rows)"]
    torch_rows = result.get("torch") or []
    if torch_rows:
        lines += ["", f"{'torch comparison':<20} {'case':<58} {'refbayes s':>10} {'torch s':>9} "
                  f"{'ref/torch':>9} {'rel err':>8}"]
        for r in torch_rows:
            if r.get("status") not in ("timed", "disagrees"):
                lines.append(f"{r.get('case', ''):<20} {r.get('params_text', ''):<58} "
                             f"{r.get('status', '').upper()}")
                continue
            lines.append(f"{r['case']:<20} {r['params_text']:<58} {fmt(r['refbayes_s']):>10} "
                         f"{fmt(r['torch_s']):>9} {fmt(r['refbayes_over_torch']):>9} "
                         f"{fmt(r['rel_err'], '.1e'):>8}"
                         + ("" if r["agrees"] else "  DISAGREES"))
    lines += ["", f"exit code: {result.get('exit_code')}"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created if its parent exists)")
    p.add_argument("--wheels", help="directory of *.whl files to pip install --no-index first")
    p.add_argument("--standin", action="store_true",
                   help="dry run on the CPU against the CuPy stand-in of tests/standin")
    p.add_argument("--quick", action="store_true",
                   help="one repeat, the first combination of each benchmark class, a subset "
                        "of the gpu tests")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="seconds for the whole run (default 420)")
    p.add_argument("--worker", choices=["benchmarks", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.budget_s > 0:
        p.error(f"--budget-s: expected seconds > 0, got {args.budget_s}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        sys.path.insert(0, str(REPO))
        try:
            return {"benchmarks": worker_bench, "torch": worker_torch}[args.worker](args)
        except Exception as err:  # recorded for the parent, then the traceback goes to the log
            with open(args.rows, "a") as f:
                f.write(json.dumps({"kind": "fatal", "error": error_text(err)}) + "\n")
            raise
    try:
        out = prepare_out(args.out)
    except ValueError as err:
        print(f"device_check.py: error: {err}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    budget = Budget(args.budget_s)
    result = {
        "tool": "tools/device_check.py",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "mode": {"standin": args.standin, "quick": args.quick,
                 "timings_meaningful": not args.standin},
        "budget_s": args.budget_s,
        "steps": {name: {"status": "pending"} for name in STEPS},
        "bytes_rule": BYTES_RULE,
        "timings": [],
        "torch": [],
    }
    json_path = out / "device_check.json"

    def save():
        result["wall_s"] = round(budget.elapsed(), 2)
        write_json(json_path, result)

    def run_step(name, fn, needs=MIN_STEP_S):
        if budget.left() - MARGIN_S < needs:
            result["steps"][name] = {"status": "not_run", "reason": "budget exhausted "
                                     f"({budget.left():.0f} s left of {budget.total:.0f})"}
        else:
            log(f"{name}: start ({budget.left():.0f} s left)")
            t0 = time.monotonic()
            try:
                rec = fn()
            except Exception as err:  # a defect of this script or the environment: recorded
                rec = {"status": "error", "reason": f"{type(err).__name__}: {err}",
                       "error": error_text(err)}
            rec.setdefault("wall_s", round(time.monotonic() - t0, 2))
            result["steps"][name] = rec
            log(f"{name}: {rec['status']} {rec.get('reason') or ''}".rstrip())
        save()

    save()
    run_step("install", lambda: step_install(args.wheels, out, budget), needs=0.0)
    run_step("versions", lambda: step_versions(result, args.standin), needs=0.0)
    no_pytest = "pytest" in result["steps"]["install"].get("missing_modules", [])
    for name, paths, share, note in (
            ("gpu_tests", QUICK_GPU_TESTS if args.quick else [], SHARES["gpu_tests"],
             "--quick: the gpu tests of " + ", ".join(QUICK_GPU_TESTS) if args.quick else ""),
            ("smoke", [SMOKE_TEST], SHARES["smoke"], "")):
        if no_pytest:
            result["steps"][name] = {"status": "not_run", "reason": "pytest is not importable"}
            save()
        elif name == "smoke" and not (REPO / SMOKE_TEST).is_file():
            result["steps"][name] = {"status": "missing", "reason": f"{SMOKE_TEST} does not exist"}
            save()
        else:
            run_step(name, functools.partial(step_pytest, name, paths, out, budget, args.standin,
                                             share, note))
    run_step("benchmarks", lambda: step_benchmarks(args, out, budget, result, save),
             needs=MIN_STEP_S + WORKER_GRACE_S)
    if args.standin:
        result["steps"]["torch"] = {"status": "skipped", "reason": "--standin: torch would time "
                                    "itself, not the stand-in; nothing to compare"}
    else:
        run_step("torch", lambda: step_torch(args, out, budget, result, save),
                 needs=MIN_STEP_S + WORKER_GRACE_S)
    result["steps"]["report"] = {"status": "passed"}
    try:
        result["raw_logs"] = bundle_raw(out)
    except OSError as err:
        result["steps"]["report"] = {"status": "error", "reason": f"bundling the raw logs: {err}"}
    result["wall_s"] = round(budget.elapsed(), 2)
    result["exit_code"] = exit_code(result["steps"])
    report = text_report(result)
    try:
        write_atomic(out / "device_check.txt", report)
    except OSError as err:
        result["steps"]["report"] = {"status": "error", "reason": f"OSError: {err}"}
        result["exit_code"] = 1
    write_json(json_path, result)
    print(report, end="")
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
