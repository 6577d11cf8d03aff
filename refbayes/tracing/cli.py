"""``refbayes trace METHOD``: build a method's golden trace, print it, and optionally write it
as JSON (``--json``) or as a golden trace file (``--save``) for ``refbayes verify``.

The options of each method are its tracer's (``TRACERS[method].options``); the problems, the
starts and the draws are specified in ``derivations/tracing.md``.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from refbayes._checks import check_int
from refbayes._files import atomic_write_text, cannot_write
from refbayes.tracing.files import save
from refbayes.tracing.printing import format_trace, to_json
from refbayes.tracing.problems import MODELS
from refbayes.tracing.tracer import DTYPES, TRACERS, Tracer, build, get_tracer

__all__ = ["add_arguments", "method_parser", "options_table", "run"]


# What each method option means: (type, help). Which methods take it and their defaults are read
# off the tracers; an option a new tracer brings without an entry here gets a generic help line.
OPTION_HELP = {
    "S": (int, "Monte Carlo draws: samples, and velocities for riemannian-laplace"),
    "curvature": (str, "ngvi: ef, hess or exact; slang: ef; laplace, riemannian-laplace: ggn, "
                       "hessian or ef; noisy-kfac, kfac: ggn, ef or mc (labels drawn from the "
                       "predictive, the official estimator); vogn, ogn: ef or ggn"),
    "M": (int, "minibatch rows"),
    "L": (int, "rank of U: SLANG's rank, and the low-rank part of the starting precision for "
               "ngvi"),
    "momentum": (float, "b of (ngvi.13); swag: the SGD's heavy-ball momentum (swag.11)"),
    "t": (int, "steps already taken (momentum shows from t > 0)"),
    "prior_precision": (float, "delta > 0 on every parameter; the MAP is refound for it"),
    "structure": (str, "precision structure: full, diag or kron"),
    "subset": (str, "random parameters: all or last_layer (laplace-torch's default subset)"),
    "ode_method": (str, "solve_ivp method RK45 (the official code's), RK23 or DOP853"),
    "rtol": (float, "solve_ivp rtol (the official code's 1e-6)"),
    "atol": (float, "solve_ivp atol (the official code's 1e-3)"),
    "K": (int, "SWAG's deviation buffer size (official max_num_models), >= 2 (with 6 steps the "
               "default 4 wraps the ring buffer)"),
    "scale": (float, "SWAG covariance multiplier (SWAG-Diagonal is traced at 1)"),
    "alpha": (float, "SGD step size on the summed objective, torch lr = N alpha (2e-3: lr 0.1 "
                     "with N = 50)"),
    "damping": (str, "factored (the official K-FAC damping) or exact (A kron S + gamma I)"),
    "kl_clip": (float, "KL-clipping bound kappa > 0 of (noisy_kfac.10) (official kl_clip, 1e-3 "
                       "in its configs; None: no clipping)"),
    "k": (int, "rank k of every layer's tie A_l = U_l V_l^T, >= 1"),
}


def _applies(defaults: dict) -> str:
    return "; ".join(f"{m}: {d}" for m, d in defaults.items())


def _keyed(segment: str):
    """("keys", "text") of a help segment "m1, m2: text" whose keys all name traced methods
    (or a family: "ngvi" for ngvi-full, ngvi-meanfield), else None."""
    head, sep, text = segment.partition(": ")
    keys = head.split(", ")
    if not sep or not all(any(m == k or m.startswith(k + "-") for m in TRACERS) for k in keys):
        return None
    return keys, text


def _help_of(text: str, method: str) -> str:
    """An option's help for one method: of a text "ngvi: ...; slang: ...; ..." the segment that
    names it (else the segments that name no method), the whole text when none is keyed."""
    segments = text.split("; ")
    keyed = [_keyed(seg) for seg in segments]
    if not any(keyed):
        return text
    mine = [k[1] for k in keyed if k and any(method == m or method.startswith(m + "-")
                                               for m in k[0])]
    return "; ".join(mine or [seg for seg, k in zip(segments, keyed) if k is None] or [text])


def _flag(dest: str) -> str:
    return "--" + (dest if len(dest) == 1 else dest.replace("_", "-"))


class _MethodHelp(argparse.Action):
    """-h/--help: after METHOD (``refbayes trace noisy-kfac --help``) that method's own help
    (``method_parser``), else the parser's, every method's options."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        method = getattr(namespace, "method", None)
        (method_parser(method, parser.prog) if method in TRACERS else parser).print_help()
        parser.exit()


def _add_common(parser, tracer: Tracer | None = None) -> None:
    """The arguments every method takes; with a tracer, their help is that method's."""
    parser.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    parser.add_argument("--precision", type=int, default=8,
                        help="digits after the point (default 8; 16 round-trips float64)")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the trace as JSON: its manifest and every input and "
                             "output as nested lists")
    parser.add_argument("--save", metavar="FILE", default=None,
                        help="write the golden trace: FILE (.npz, no pickle: every input, draw "
                             "and intermediate by name) and FILE.json (its manifest), for "
                             "`refbayes verify`")
    if tracer is None:
        steps = ("K chained steps (default 1; noisy-kfac, kfac: 2; steps k + 1 >= 2 draw from "
                 "default_rng([seed, k])); swag: the SGD steps T >= 2 (default 6); the Laplace "
                 "traces are one fit (1)")
        dtype = "precision of the traced run (default float64; float32 for the methods traced " \
                "in both)"
    else:
        if not tracer.chained:
            steps = f"{tracer.name} is traced as one fit: 1 only"
        elif tracer.name != "swag":
            steps = (f"K chained steps (default {tracer.default_steps}; steps k + 1 >= 2 draw "
                     "from default_rng([seed, k]))")
        else:
            steps = f"the steps T >= 2 (default {tracer.default_steps})"
        dtype = "precision of the traced run (default float64; float32 too)" if tracer.float32 \
            else f"{tracer.name} is traced in float64 only"
    parser.add_argument("--steps", type=int, default=None, help=steps)
    parser.add_argument("--dtype", default=None, help=dtype,
                        choices=DTYPES if tracer is None or tracer.float32 else DTYPES[:1])
    if tracer is None:  # a method's own help names --model in its description (method_parser)
        on_cnn = ", ".join(t.name for t in TRACERS.values() if t.models)
        parser.add_argument("--model", default=None, choices=MODELS,
                            help="trace on this model instead of the method's shipped one: "
                                 "tiny-cnn, a 1x6x6 3-class CNN on synthetic images "
                                 f"(derivations/tracing.md); for {on_cnn}")


def add_arguments(parser) -> None:
    """Add the ``refbayes trace`` arguments to an argparse parser.

    A parser made with ``add_help=False`` gets a -h/--help that prints, after METHOD, only that
    method's options with its defaults (``method_parser``), and without one every method's.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The ``trace`` subcommand's parser.
    """
    if not parser.add_help:
        parser.add_argument("-h", "--help", action=_MethodHelp,
                            help="show this help and exit; after METHOD, that method's options "
                                 "only (refbayes trace METHOD --help)")
    parser.add_argument("method", metavar="METHOD", help=f"one of {', '.join(TRACERS)}")
    _add_common(parser)
    group = parser.add_argument_group(
        "method options",
        "Each applies to the methods listed, with their defaults; the problems, starts and "
        "draws are specified in derivations/tracing.md. `refbayes trace METHOD --help` lists "
        "one method's.")
    for dest, defaults in options_table().items():
        kind, text = OPTION_HELP.get(dest, (str, "an option of the traced method"))
        group.add_argument(_flag(dest), dest=dest, type=kind, default=None,
                           help=f"{text} (default by method: {_applies(defaults)})")


def method_parser(method: str, prog: str = "refbayes trace") -> argparse.ArgumentParser:
    """Build the parser of one method's help: the common arguments and its own options.

    Its options are ``TRACERS[method].options``, each shown with the method's default.

    Parameters
    ----------
    method : str
        A key of ``TRACERS``.
    prog : str, default "refbayes trace"
        The command it follows; the usage reads "PROG METHOD ...".

    Returns
    -------
    argparse.ArgumentParser
        For ``print_help``; ``refbayes trace`` itself parses with ``add_arguments``' parser.
    """
    tracer = get_tracer(method)
    parser = argparse.ArgumentParser(
        prog=f"{prog} {method}",
        description=f"Build the golden trace of {method} on its small shipped problem and print "
                    f"it. Its equations: {tracer.derivation}; the problem, the start and the "
                    "draws: derivations/tracing.md." + (
                        f" It is also traced on {', '.join(tracer.models)} (--model "
                        f"{tracer.models[0]}: a 1x6x6 3-class CNN on synthetic images, in place "
                        "of the shipped model)." if tracer.models else ""))
    _add_common(parser, tracer)
    group = parser.add_argument_group(
        f"{method} options", "Its own options, with its defaults." if tracer.options else
        f"{method} takes no options of its own.")
    for dest, default in tracer.options.items():
        kind, text = OPTION_HELP.get(dest, (str, "an option of the traced method"))
        group.add_argument(_flag(dest), dest=dest, type=kind, default=None,
                           help=f"{_help_of(text, method)} (default: {default})")
    return parser


def options_table() -> dict:
    """Collect the method options of every tracer.

    Returns
    -------
    dict
        Option dest -> {traced method it applies to: its default there}, in tracer order.
    """
    table: dict = {}
    for tracer in TRACERS.values():
        for dest, default in tracer.options.items():
            table.setdefault(dest, {})[tracer.name] = default
    return table


def _resolve(args) -> dict:
    """The options that apply to args.method, defaults filled in; ValueError for one given to a
    method it does not apply to (None in the parser means "not given")."""
    method = get_tracer(args.method).name
    out = {}
    for dest, defaults in options_table().items():
        value = getattr(args, dest, None)
        if method in defaults:
            out[dest] = defaults[method] if value is None else value
        elif value is not None:
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag}: applies to {', '.join(defaults)} only, not {method}")
    return out


def _json_folder(path: Path, flag: str = "--json") -> None:
    """Make ``path``'s folder ready: create it when its own parent exists, never more, and see
    that a file can be created there, before the trace is built.

    A mistyped ``--json /nonexistent/dir/x.json`` is an error naming the path, not a tree of
    folders created from the filesystem root; an unwritable folder (``/proc``, read-only) is one
    too, not a traceback about a temporary file after the trace was computed.
    """
    parent = path.parent
    if not parent.is_dir():
        for folder in (parent, parent.parent):
            if folder.exists() and not folder.is_dir():
                raise ValueError(f"{flag}: cannot write {path}: {folder} is not a folder")
        if not parent.parent.is_dir():
            raise ValueError(f"{flag}: cannot write {path}: the folder {parent.parent} does not "
                             "exist (only the file's own folder is created)")
        try:
            parent.mkdir()
        except OSError as err:
            raise cannot_write(flag, path, err) from None
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".tmp"):
            pass
    except OSError as err:
        raise cannot_write(flag, path, err) from None


def run(args) -> int:
    """Run the ``refbayes trace`` handler: print the trace, optionally write its JSON or npz.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments of ``add_arguments``.

    Returns
    -------
    int
        The exit status, 0.

    Raises
    ------
    ValueError
        For an unknown method, an option outside its range or given to a method it does not
        apply to, --steps > 1 for a one-fit trace, float32 for a float64-only trace, a --model
        the method is not traced on, or a
        --json / --save path whose folder cannot be made or written to (the message names the
        flag and the path, never a temporary file).
    """
    precision = check_int(args.precision, "precision", low=0, high=17)
    tracer = get_tracer(args.method)
    if args.json is not None:
        _json_folder(Path(args.json))
    if args.save is not None:
        if not str(args.save).endswith(".npz"):
            raise ValueError(f"--save: expected a file name ending in .npz, got {args.save!r}")
        _json_folder(Path(args.save), "--save")
    options = _resolve(args)
    if not tracer.chained and args.steps not in (None, 1):
        raise ValueError(f"--steps: {tracer.name} is traced as one fit; expected 1, got "
                         f"{args.steps}")
    model = getattr(args, "model", None)
    if model is not None and model not in tracer.models:
        raise ValueError(f"--model: {tracer.name} is traced on its shipped model only, got "
                         f"{model!r}" if not tracer.models else
                         f"--model: expected one of {', '.join(tracer.models)} for "
                         f"{tracer.name}, got {model!r}")
    trace = build(tracer.name, seed=args.seed, steps=args.steps, dtype=args.dtype or "float64",
                  model=model, **options)
    print(format_trace(trace, precision), end="")
    if args.json is not None:
        try:
            path = atomic_write_text(args.json, json.dumps(to_json(trace), indent=1) + "\n")
        except OSError as err:
            raise cannot_write("--json", args.json, err) from None
        print(f"json: {path}")
    if args.save is not None:
        try:
            path = save(trace, args.save)
        except OSError as err:
            raise cannot_write("--save", args.save, err) from None
        print(f"saved: {path} and {path.name}.json")
    return 0
