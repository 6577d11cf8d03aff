"""``.. refbayes-cli::``: the command-line reference, generated from ``refbayes.cli.build_parser()``.

Walks the argparse tree (every subcommand, depth first) and emits, per command, a section with
its ``--help`` text verbatim, so the page cannot drift from the parser; after ``refbayes trace``,
one section per traced method with ``refbayes trace METHOD --help`` (``method_parser``: that
method's options and defaults).
"""
from __future__ import annotations

import argparse
import os

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("refbayes",)):
    """Yield (command words, parser) for the parser and every subparser below it, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, path + (name,))


def help_text(parser: argparse.ArgumentParser) -> str:
    os.environ.setdefault("COLUMNS", "100")  # argparse wraps to $COLUMNS: a stable page
    return parser.format_help()


class CLIReference(SphinxDirective):
    has_content = False

    def run(self):
        out = []
        for title, text in sections():
            section = nodes.section(ids=[nodes.make_id("cli " + title)])
            section += nodes.title(text=title)
            section += nodes.literal_block(text=text, language="text")
            out.append(section)
        return out


def sections():
    """(title, --help text) of every command, the traced methods' after ``refbayes trace``."""
    from refbayes.cli import build_parser
    from refbayes.tracing.cli import method_parser
    from refbayes.tracing.tracer import TRACERS

    out = []
    for words, parser in walk(build_parser()):
        out.append((" ".join(words), help_text(parser)))
        if words == ("refbayes", "trace"):
            out += [(f"refbayes trace {m}", help_text(method_parser(m))) for m in TRACERS]
    return out


def setup(app):
    app.add_directive("refbayes-cli", CLIReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
