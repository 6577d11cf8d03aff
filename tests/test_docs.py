"""Every command in the README and the documentation pages is checked, so none can rot.

Shell commands in ``bash`` code blocks of README.md and docs/*.md are split at ``&&`` / ``&`` and
each part is checked by what it is:

- ``refbayes ...``: parsed by the real parser (``refbayes.cli.build_parser``): subcommands,
  choices and options all exist. The three verification commands are also RUN as written
  (``test_verify_commands_run_as_written``); the others start minutes-long experiments and are
  only parsed;
- ``pip install ".[EXTRAS]"``: every extra exists in pyproject.toml (installing is .ci/run's job);
- the README's test command, the docs build and the stand-in run: .ci/run runs them verbatim;
- ``asv``, ``dask``: their ``--help`` (only where the ``bench`` / ``dask`` extras are
  installed; the test says so when it skips).

Inline ``refbayes ...`` spans in the prose are checked against the parser too: every subcommand
they name exists and every ``--option`` they name belongs to it. Inline ``python tools/...``,
``pip install``, ``dask`` and ``mpiexec`` spans are checked by ``--help``, the extras, or the test
that runs them (``test_inline_tool_commands``).

The tutorials (docs/tutorial_scripts) are not run here: the docs build executes them (.ci/run).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from refbayes import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
CI_RUN = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
_PYPROJECT = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
EXTRAS = set(re.findall(r"^([a-z0-9-]+) = \[", _PYPROJECT.split("[project.optional-dependencies]")[1]
                        .split("\n[")[0], re.M))
BIN = Path(sys.executable).parent  # the venv's bin: refbayes, pip, sphinx-build


def _blocks(lang: str):
    """(page, text of each ``lang`` fenced block)."""
    for page in PAGES:
        for body in re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(encoding="utf-8"),
                               re.S | re.M):
            yield page, body


def _commands():
    """Every shell command line of the pages: (page name, line without its comment)."""
    out = []
    for page, body in _blocks("bash"):
        for line in body.strip().splitlines():
            out.append((page.relative_to(ROOT).as_posix(), re.sub(r"\s+#\s.*$", "", line).strip()))
    return out


COMMANDS = _commands()


def test_the_pages_have_commands():
    assert len(COMMANDS) >= 8, "no bash blocks found: the pattern above is stale"


@pytest.fixture(scope="module")
def parser():
    return cli.build_parser()  # with the experiments and the trace methods loaded


def _parse(parser, words):
    try:
        return parser.parse_args(words)
    except SystemExit as exc:
        raise AssertionError(f"refbayes {' '.join(words)}: argparse refused it") from exc


def _check_part(part: str, parser, tmp_path) -> str | None:
    """Check one command; return a reason when it cannot be checked here (a skip)."""
    env_prefix = re.match(r"^((?:[A-Z_]+=\S+\s+)*)(.*)$", part)
    env, cmd = env_prefix.group(1), env_prefix.group(2)
    words = shlex.split(cmd)
    exe = words[0]
    if exe in ("python3",) and words[1:3] == ["-m", "venv"]:
        return None  # the standard library's venv
    if exe.endswith("/pip") and words[1] == "install":
        spec = words[-1]
        extras = re.fullmatch(r"(?:-e )?\.\[([a-z0-9,-]+)\]", spec)
        assert extras, f"{part}: installs {spec!r}, not this project with extras"
        missing = set(extras.group(1).split(",")) - EXTRAS
        assert not missing, f"{part}: extras {missing} are not in pyproject.toml"
        return None
    if exe.endswith("/python") and words[1:3] == ["-m", "pytest"] or exe.endswith("sphinx-build"):
        # the test suite and the docs build: .ci/run runs these lines (verbatim, or with
        # -p no:cacheprovider appended)
        assert (env + cmd) in CI_RUN, f"{part}: not run by .ci/run"
        return None
    if exe in ("refbayes",) or exe.endswith("/refbayes"):
        _parse(parser, words[1:])
        return None
    if exe == "cd":
        assert (ROOT / words[1]).is_dir(), part
        return None
    if exe.endswith("/asv") or exe == "dask":
        tool = shutil.which(Path(exe).name, path=str(BIN) + os.pathsep + os.environ["PATH"])
        if tool is None:
            return f"{exe} is not installed (the bench / dask extra): `{part}` is not checked"
        run = subprocess.run([tool, *words[1:2], "--help"], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        return None
    if exe == "python" and words[1] == "examples/torch_verify.py":
        # run for real by test_verify_commands_run_as_written (needs torch)
        assert (ROOT / words[1]).is_file()
        return None
    raise AssertionError(f"no check for the command {part!r}: add one to tests/test_docs.py")


@pytest.mark.parametrize("page, line", COMMANDS, ids=[f"{p}:{c[:50]}" for p, c in COMMANDS])
def test_every_command_is_checked(page, line, parser, tmp_path):
    skipped = []
    for part in re.split(r"\s+&&\s+|\s+&(?:\s+|$)", line):
        if part.strip():
            reason = _check_part(part.strip(), parser, tmp_path)
            if reason:
                skipped.append(reason)
    if skipped:
        pytest.skip("; ".join(skipped))


def test_ci_runs_the_readme_test_and_docs_commands_verbatim():
    readme = [c for p, c in COMMANDS if p == "README.md"]
    test_cmd = next(c for c in readme if c.endswith("-m pytest"))
    docs_cmd = next(c for c in readme if "sphinx-build" in c)
    lines = CI_RUN.splitlines()
    assert test_cmd in lines, "the README's test command differs from .ci/run's"
    assert docs_cmd in lines, "the README's docs command differs from .ci/run's"
    assert "-W" in docs_cmd.split(), "the docs build must fail on warnings"


def test_readme_python_runs():
    """The README's "ten lines of Python" (about 2 s)."""
    (code,) = [b for _, b in _blocks("python") if _.name == "README.md"]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    state = namespace["state"]
    assert state.t > 0 and state.mu.shape == (6,)


def test_verify_commands_run_as_written(tmp_path):
    """The README's three commands, verbatim, in a fresh folder: exit 0 and every quantity
    agrees. The second needs torch (the conformance extra); without it, the first is run and
    the third only parsed (tests/test_examples.py covers the script's dump itself)."""
    lines = [c for p, c in COMMANDS if p == "README.md" and "vogn.npz" in c]
    assert len(lines) == 3 and lines[1].startswith("python examples/torch_verify.py")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    for i, line in enumerate(lines):
        if i > 0 and not have_torch:
            _parse(cli.build_parser(), shlex.split(lines[2])[1:])
            pytest.skip("torch is not installed (the conformance extra): command 2 not run, "
                        "command 3 parsed only")
        words = shlex.split(line)
        if words[0] == "python":
            words[0] = sys.executable
        run = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 0, f"{line}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    assert "OK: every compared quantity agrees" in run.stdout


def _subparsers(p: argparse.ArgumentParser) -> dict:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _inline_commands():
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # blocks: checked above
        for span in re.findall(r"`((?:\.venv/bin/)?refbayes [^`]+)`", text):
            out.append((page.relative_to(ROOT).as_posix(), span))
    return out


INLINE = _inline_commands()


def test_the_pages_have_inline_commands():
    assert len(INLINE) >= 10


@pytest.mark.parametrize("page, span", INLINE, ids=[f"{p}:{s[:40]}" for p, s in INLINE])
def test_inline_commands_name_real_subcommands_and_options(page, span, parser):
    """Inline mentions are often schematic (`refbayes trace METHOD --save FILE`, `[--quick]`,
    `a|b`): their subcommands must exist and every option they name must belong to the
    command."""
    words = span.replace("[", " ").replace("]", " ").split()[1:]
    p, rest = parser, list(words)
    while rest and rest[0] in _subparsers(p):
        p = _subparsers(p)[rest.pop(0)]
    options = {o for a in p._actions for o in a.option_strings}
    named = {w.split("=")[0] for w in words if w.startswith("--")}
    unknown = sorted(named - options)
    assert not unknown, f"{page}: `{span}` names options that `{p.prog}` lacks: {unknown}"
    if rest and not rest[0].startswith("-") and not rest[0].isupper() and "/" not in rest[0]:
        assert not _subparsers(p), f"{page}: `{span}`: `{p.prog}` has no subcommand {rest[0]!r}"
        positional = next((a for a in p._actions if not a.option_strings), None)
        assert positional is not None, f"{page}: `{span}`: `{p.prog}` takes no {rest[0]!r}"
        known = _choices(positional)
        if p.prog.startswith("refbayes data"):
            from refbayes.datasets import dataset_names
            known = list(dataset_names(include_optional=True))
        assert known, f"{page}: `{span}`: cannot tell the choices of `{p.prog}` {positional.dest}"
        assert rest[0] in known, f"{page}: `{span}`: {rest[0]!r} is not one of {known}"


def _choices(action) -> list[str]:
    """A positional's choices, or those its help lists ("one of a, b, c", "the report: a, b":
    `refbayes trace` and `conformance` check their argument against a registry, not through
    argparse)."""
    if action.choices:
        return list(action.choices)
    listed = re.search(r"(?:one of|:) ([\w-]+(?:, [\w-]+)+)\W*$", action.help or "")
    return [c.strip() for c in listed.group(1).split(",")] if listed else []


def _inline_tool_commands():
    out = []
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
        for span in re.findall(r"`((?:python|pip|dask|mpiexec) [^`]+)`", text):
            out.append((page.relative_to(ROOT).as_posix(), span))
    return out


INLINE_TOOLS = _inline_tool_commands()


@pytest.mark.parametrize("page, span", INLINE_TOOLS, ids=[f"{p}:{s[:40]}" for p, s in INLINE_TOOLS])
def test_inline_tool_commands(page, span):
    """The other commands the prose names: extras exist, scripts accept the options named
    (``--help``), and the two that are not run say why."""
    words = span.split() if span.startswith("pip ") else \
        span.replace("[", " ").replace("]", " ").split()  # [--wheels WHEELS]: optional
    if words[:2] == ["pip", "install"]:
        extras = re.fullmatch(r'"(?:\.|refbayes)\[([a-z0-9,-]+)\]"', words[2])
        assert extras, f"{page}: `{span}`"
        assert set(extras.group(1).split(",")) <= EXTRAS, f"{page}: `{span}`: unknown extra"
    elif words[:2] == ["pip", "list"]:
        pass  # pip's own command
    elif words[0] == "python" and words[1].startswith("tools/"):
        run = subprocess.run([sys.executable, str(ROOT / words[1]), "--help"], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        for option in (w for w in words if w.startswith("--")):
            assert option in run.stdout, f"{page}: `{span}`: {words[1]} has no {option}"
    elif words[:3] == ["python", "-m", "refbayes.tracing"]:
        # not run: it rewrites the committed traces (tests/test_golden.py rebuilds them)
        assert "main()" in (ROOT / "refbayes" / "tracing" / "__main__.py").read_text()
        assert all((ROOT / w).is_dir() for w in words[3:])
    elif words[0] == "mpiexec":
        # run under a real mpiexec by tests/methods/test_vogn_mpi.py (the mpi extra)
        assert "mpiexec" in (ROOT / "tests" / "methods" / "test_vogn_mpi.py").read_text()
    elif words[0] == "dask":
        tool = shutil.which("dask", path=str(BIN) + os.pathsep + os.environ["PATH"])
        if tool is None:
            pytest.skip("dask is not installed (the dask extra)")
        run = subprocess.run([tool, words[1], "--help"], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr
        for option in (w for w in words if w.startswith("--")):
            assert option in run.stdout, f"{page}: `{span}`: dask {words[1]} has no {option}"
    else:
        raise AssertionError(f"{page}: no check for `{span}`: add one to tests/test_docs.py")


def test_cli_reference_has_each_trace_methods_own_help():
    """docs/cli.md's generated page: after `refbayes trace`, one section per traced method with
    that method's options and defaults (the generic trace help names no method's defaults)."""
    pytest.importorskip("sphinx")
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    from refbayes.tracing.tracer import TRACERS

    pages = dict(cli_reference.sections())
    for method in TRACERS:
        text = pages[f"refbayes trace {method}"]
        assert text.startswith(f"usage: refbayes trace {method}")
        assert f"{method} options" in text
    assert "--kl-clip" in pages["refbayes trace noisy-kfac"]
    assert "--kl-clip" not in pages["refbayes trace vogn"]
