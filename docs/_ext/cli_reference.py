"""``.. refbayes-cli::``: the command-line reference, generated from ``refbayes.cli.build_parser()``.

Walks the argparse tree (every subcommand, depth first) and emits, per command, a section with
its ``--help`` text verbatim, so the page cannot drift from the parser.
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
        from refbayes.cli import build_parser

        out = []
        for words, parser in walk(build_parser()):
            title = " ".join(words)
            section = nodes.section(ids=[nodes.make_id("cli " + title)])
            section += nodes.title(text=title)
            section += nodes.literal_block(text=help_text(parser), language="text")
            out.append(section)
        return out


def setup(app):
    app.add_directive("refbayes-cli", CLIReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
