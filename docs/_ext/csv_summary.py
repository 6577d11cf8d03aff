"""``.. refbayes-csv:: PATH``: a table of chosen columns of a result CSV, read at build time.

Options: ``:columns:`` (comma-separated names, default all), ``:digits:`` (significant digits of
floats, default 4). PATH is relative to the document; the data stays where it is.
"""
from __future__ import annotations

import csv
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective


def _cell(value: str, digits: int) -> str:
    try:
        number = float(value)
    except ValueError:
        return value
    if value.strip().lstrip("-").isdigit():
        return value
    return f"{number:.{digits}g}"


class CSVSummary(SphinxDirective):
    required_arguments = 1
    option_spec = {"columns": directives.unchanged, "digits": directives.nonnegative_int}

    def run(self):
        _, path = self.env.relfn2path(self.arguments[0])
        path = Path(path)
        self.env.note_dependency(str(path))
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        columns = ([c.strip() for c in self.options["columns"].split(",")]
                   if "columns" in self.options else list(rows[0]) if rows else [])
        digits = self.options.get("digits", 4)
        table = nodes.table(classes=["refbayes-csv"])
        group = nodes.tgroup(cols=len(columns))
        table += group
        group += [nodes.colspec(colwidth=1) for _ in columns]

        def row(cells):
            r = nodes.row()
            for c in cells:
                r += nodes.entry("", nodes.paragraph(text=c))
            return r

        head = nodes.thead()
        head += row(columns)
        body = nodes.tbody()
        for r in rows:
            body += row(_cell(r.get(c, ""), digits) for c in columns)
        group += [head, body]
        return [table]


def setup(app):
    app.add_directive("refbayes-csv", CSVSummary)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
