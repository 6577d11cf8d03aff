"""The refbayes command: data, reproduce, trace, verify, conformance and derivation.

Subcommands: data list|fetch|verify, reproduce EXPERIMENT, trace METHOD, verify TRACE YOURS,
conformance NAME and derivation NAME (print the note that ``derivations/NAME.md`` names).

This module only parses arguments and calls library functions (``refbayes.datasets``, the
experiment modules registered in ``refbayes.experiments.EXPERIMENTS``, ``refbayes.trace``). A
ValueError or OSError (FileNotFoundError, a failed download) becomes ``refbayes: error: ...`` on
stderr and exit status 2, without a traceback; ``data verify`` exits 1 when a file is missing or
mismatched, ``verify`` when a quantity diverges, and ``conformance`` when the library under test
has a defect (``CONFORMANCE_EXIT_STATUS``). A Ctrl-C becomes ``refbayes: interrupted`` and exit
status 130; during a ``reproduce`` run, followed by what was saved where and how to resume
(``experiments.interrupted_note``). SIGTERM (``kill``, a batch scheduler's pre-emption; a job
started in the background by a shell ignores Ctrl-C's SIGINT) ends a command the same way, as
``refbayes: terminated (SIGTERM)`` and exit status 143.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
from pathlib import Path

from refbayes import __version__, experiments
from refbayes._files import format_table
from refbayes.datasets import (
    DATASETS,
    dataset_names,
    fetch,
    get_dataset,
    resolve_data_dir,
    verify,
)

__all__ = ["build_parser", "derivations_dir", "main"]

# `refbayes conformance --help` and docs/commands.md ("Exit status") say this; tests/test_cli.py
# checks both against what `main` returns.
CONFORMANCE_EXIT_STATUS = (
    "Exit status: 0 when every row agrees or is a documented convention (and for --list); 1 when "
    "the report ran to the end and at least one row is a defect (a difference no documented "
    "convention explains: a finding about the library under test, or about refbayes where the "
    "row's note says so, not a crash of the command); 2 on a usage error, an unknown NAME, or "
    "torch or the library missing; 130 when interrupted.")


def _cmd_list(args) -> int:
    root = resolve_data_dir(args.data_dir)
    rows = []
    for spec in DATASETS.values():
        # A file counts as present in any of its accepted forms (full MNIST's staged .npm.gz).
        present = sum(any((root / g.path).is_file() for g in (f, *f.alternates))
                      for f in spec.files)
        size_mb = sum(f.size for f in spec.files) / 1e6
        rows.append([spec.name, f"{present}/{len(spec.files)}", f"{size_mb:.2f} MB", spec.source])
    print(f"data directory: {root}")
    print(format_table(["name", "present", "size", "source"], rows))
    return 0


def _cmd_fetch(args) -> int:
    for name in args.names:  # validate every name before downloading anything
        get_dataset(name)
    for name in args.names:
        results = fetch(name, args.data_dir, force=args.force, progress=not args.no_progress)
        fresh = sum(r.detail.startswith("downloaded") for r in results)
        print(f"{name}: {len(results)} files ok ({fresh} downloaded)")
    return 0


def _cmd_verify(args) -> int:
    names = args.names or dataset_names(include_optional=True)
    for name in names:
        get_dataset(name)
    root = resolve_data_dir(args.data_dir)
    if not root.is_dir():
        print(f"data directory {root} does not exist: nothing to verify; run `refbayes data fetch "
              "NAME` or point --data-dir / REFBAYES_DATA at the data folder", file=sys.stderr)
        return 1
    print(f"data directory: {root}")
    failed = 0
    for name in names:
        results = verify(name, args.data_dir)
        bad = [r for r in results if r.status != "ok"]
        if not args.names and get_dataset(name).optional and all(r.status == "missing" for r in bad) \
                and len(bad) == len(results):
            # An optional dataset nobody fetched is not a defect of the folder.
            print(f"{name}: not present (optional; `refbayes data fetch {name}`)")
            continue
        failed += len(bad)
        summary = f"{len(results) - len(bad)}/{len(results)} ok"
        counts = {s: sum(r.status == s for r in bad) for s in ("missing", "mismatch")}
        extra = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        print(f"{name}: {summary}" + (f"; {extra}" if extra else ""))
        if not args.verbose and counts["missing"] == len(results):
            # A dataset never fetched: one line, not one per file (UCI sets have 48).
            print(f"  missing   every file under {root / get_dataset(name).folder}")
            continue
        for r in results if args.verbose else bad:
            print(f"  {r.status:<8}  {r.path}  ({r.detail})")
    if failed:
        print(f"{failed} file(s) missing or mismatched; run `refbayes data fetch NAME` to repair.",
              file=sys.stderr)
    return 1 if failed else 0


def derivations_dir() -> Path:
    """The folder of the derivation notes that docstrings and messages name ``derivations/NAME.md``.

    An install carries them inside the package (``refbayes/derivations/``, copied there by
    setup.py's build step); a source checkout has them at the top of the repository.

    Returns
    -------
    pathlib.Path
        The folder holding ``notation.md`` and one note per method.

    Raises
    ------
    OSError
        If neither place holds the notes (a build that left them out).
    """
    here = Path(__file__).resolve().parent
    for folder in (here / "derivations", here.parent / "derivations"):
        if (folder / "notation.md").is_file():
            return folder
    raise OSError(f"the derivation notes are missing: neither {here / 'derivations'} nor "
                  f"{here.parent / 'derivations'} holds them; reinstall refbayes (`pip install .`)")


def _cmd_derivation(args) -> int:
    folder = derivations_dir()
    notes = sorted(p.stem for p in folder.glob("*.md"))
    if args.name is None:
        print(f"derivation notes in {folder} (`refbayes derivation NAME` prints one):")
        rows = []
        for stem in notes:
            first = (folder / f"{stem}.md").read_text(encoding="utf-8").lstrip().split("\n")[0]
            rows.append([stem, first.lstrip("# ").strip()])
        print(format_table(["name", "title"], rows))
        return 0
    # a pointer as printed ("derivations/vogn.md#errata") is accepted as it stands
    stem = args.name.split("#")[0].strip()
    stem = stem.removeprefix("derivations/").removesuffix(".md")
    if stem not in notes:
        raise ValueError(f"NAME: expected one of {', '.join(notes)}, got {args.name!r}")
    path = folder / f"{stem}.md"
    print(path if args.path else path.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0


def _add_derivation(sub) -> None:
    p = sub.add_parser(
        "derivation", help="print a derivation note (the derivations/NAME.md that messages name)",
        description="Print the derivation note NAME: the equations (NAME.n) that code comments, "
                    "docstrings, messages and traces tag, with the errata and the conventions of "
                    "public implementations. Docstrings and messages point to the notes as "
                    "derivations/NAME.md; they are installed with the package (a source checkout "
                    "reads the repository's derivations/). Without NAME, list the notes.")
    try:
        notes = ", ".join(sorted(path.stem for path in derivations_dir().glob("*.md")))
    except OSError as err:  # reported when the command runs
        notes = f"(unavailable: {err})"
    p.add_argument("name", nargs="?", metavar="NAME",
                   help="the note, also as 'vogn.md' or a pointer as printed "
                        "('derivations/vogn.md#errata'); none lists them; one of " + notes)
    p.add_argument("--path", action="store_true", help="print the note's file path, not its text")
    p.set_defaults(_handler=_cmd_derivation)


def _unavailable(name: str, err: Exception):
    def run(args) -> int:
        raise ValueError(f"experiment {name!r} could not be imported: {err}")
    return run


def _with_threads(parser, handler):
    """Give an experiment's parser --threads, and run its handler under that BLAS limit, with
    freed memory kept for reuse (``experiments.retain_freed_memory``)."""
    parser.add_argument("--threads", type=experiments.positive_int, default=1,
                        help="BLAS / OpenMP threads per process (default 1: on a loaded 2-core "
                             "machine an unpinned BLAS ran 30-65x slower; with --jobs, per job)")

    def run(args) -> int:
        experiments.retain_freed_memory()  # no page faults per step on the temporaries (see there)
        with experiments.thread_limit(args.threads):
            return handler(args)
    return run


def _add_experiments(sub) -> None:
    for name in experiments.EXPERIMENTS:
        try:
            module = experiments.get_experiment(name)
        except ImportError as err:
            # One broken experiment must not take down the others or `data`; it fails when run.
            p = sub.add_parser(name, help=f"(unavailable: {err})")
            p.set_defaults(_handler=_unavailable(name, err))
            continue
        p = sub.add_parser(name, help=module.DESCRIPTION, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.set_defaults(_handler=_with_threads(p, module.run))


def _add_data(sub) -> None:
    data = sub.add_parser("data", help="list, fetch or verify the benchmark datasets",
                          description="Benchmark data; the directory is --data-dir, else "
                                      "$REFBAYES_DATA, else the user cache.")
    dsub = data.add_subparsers(dest="data_command", metavar="{list,fetch,verify}", required=True)

    def with_dir(p):
        p.add_argument("--data-dir", default=None, help="data directory (overrides $REFBAYES_DATA)")
        return p

    with_dir(dsub.add_parser("list", help="table of datasets: files present, size, source")) \
        .set_defaults(_handler=_cmd_list)
    f = with_dir(dsub.add_parser("fetch", help="download and verify datasets"))
    f.add_argument("names", nargs="+", metavar="NAME", help="dataset name(s), see `data list`")
    f.add_argument("--force", action="store_true", help="download even files that verify")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.set_defaults(_handler=_cmd_fetch)
    v = with_dir(dsub.add_parser("verify", help="check checksums; exit 1 if anything is wrong"))
    v.add_argument("names", nargs="*", metavar="NAME", help="dataset name(s); default: all (optional datasets that "
                                                          "are entirely absent are skipped)")
    v.add_argument("-v", "--verbose", action="store_true", help="one line per file")
    v.set_defaults(_handler=_cmd_verify)


def _add_trace(sub, load: bool) -> None:
    p = sub.add_parser("trace", help="one step of a method (a Laplace fit, a SWAG run), every "
                                     "intermediate by its equation tag",
                       description="Build the golden trace of METHOD on its small shipped "
                                   "problem (one or K chained steps, a Laplace fit, a SWAG run) "
                                   "and print it: the model, the config, every input and draw in "
                                   "full, then each step's named intermediates under their "
                                   "equation tags. --json writes it exactly; --save FILE writes "
                                   "the golden trace that `refbayes verify` reads. The problems, "
                                   "starts and draws: derivations/tracing.md.",
                       add_help=not load)  # with load, tracing.cli's help: one method's or all
    if not load:  # only `refbayes trace ...` pays for importing the methods
        return
    trace = importlib.import_module("refbayes.tracing.cli")
    trace.add_arguments(p)
    p.set_defaults(_handler=trace.run)


def _add_tool(sub, name: str, load: bool, help: str, description: str) -> None:
    """A subcommand whose module (refbayes.<name>) has ``add_arguments`` and ``run``."""
    p = sub.add_parser(name, help=help, description=description)
    if not load:
        return
    module = importlib.import_module(f"refbayes.{name}")
    module.add_arguments(p)
    p.set_defaults(_handler=module.run)


def build_parser(load_experiments: bool = True, load_trace: bool = True) -> argparse.ArgumentParser:
    """The argument parser; ``load_experiments`` imports the experiment modules for ``reproduce``,
    ``load_trace`` the methods for ``trace``."""
    parser = argparse.ArgumentParser(
        prog="refbayes", description=__doc__.split("\n")[0],
        epilog="Docstrings, messages and traces point to derivation notes as derivations/NAME.md; "
               "they are installed with the package: `refbayes derivation NAME` prints one.")
    parser.add_argument("--version", action="version", version=f"refbayes {__version__}")
    sub = parser.add_subparsers(
        dest="command", metavar="{data,reproduce,trace,verify,conformance,derivation}",
        required=True)
    _add_data(sub)
    rep = sub.add_parser("reproduce", help="run a paper experiment (list: `reproduce --help`)",
                         description="Run one registered experiment.")
    rsub = rep.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    if load_experiments:
        _add_experiments(rsub)
    _add_trace(sub, load_trace)
    _add_tool(sub, "verify", load_trace,
              "compare your implementation's dump with a golden trace",
              "Compare YOURS.npz (any subset of a golden trace's named quantities, step by step) "
              "with TRACE.npz (from `refbayes trace METHOD --save`); report the first diverging "
              "quantity with its equation tag; exit 0 when everything agrees, 1 otherwise.")
    _add_tool(sub, "conformance", load_trace,
              "run a public library against refbayes on identical inputs (needs the "
              "`conformance` extra: torch)",
              "Run a public implementation (laplace-torch, ivon-opt, BackPACK, curvlinops) and "
              "refbayes on identical inputs and draws; print quantity, max relative error and verdict. "
              + CONFORMANCE_EXIT_STATUS)
    _add_derivation(sub)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is, so that it ends as a Ctrl-C does."""


def _raise_terminated(signum, frame):
    raise _Terminated


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises :class:`_Terminated` inside the block; the previous handler is restored
    after it. Only the main thread can set a handler, so elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv=None) -> int:
    """Entry point of the ``refbayes`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Experiment modules (and the methods, for `trace`) are imported only when asked for, so
    # `data ...` stays fast.
    parser = build_parser(load_experiments=argv[:1] == ["reproduce"],
                          load_trace=argv[:1] in (["trace"], ["verify"], ["conformance"]))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage/help or its error message
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    experiments.forget_run()  # interrupted_note speaks of a run this command started, or none
    try:
        with _sigterm_as_interrupt():
            return int(args._handler(args))
    except BrokenPipeError:  # the reader went away (`refbayes data list | head`): nothing to say
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as stop:
        # what a `reproduce` run saved (folder, results, checkpoints) and how to resume it
        note = experiments.interrupted_note()
        what, status = (("terminated (SIGTERM)", 143) if isinstance(stop, _Terminated)
                        else ("interrupted", 130))
        print(f"refbayes: {what}" + (f"; {note}" if note else ""), file=sys.stderr)
        return status
    except (ValueError, OSError) as err:
        print(f"refbayes: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
