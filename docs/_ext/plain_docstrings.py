"""Render refbayes' plain-text docstrings faithfully in reST.

The docstrings write math in ASCII (``|x|``, ``*args``, aligned equation blocks), which reST
would read as substitutions, emphasis and block quotes. Before numpydoc parses them:

* a module docstring keeps its first paragraph as prose and shows the rest verbatim (a literal
  block), so its aligned equations and lists keep their layout;
* in other docstrings, ``|`` and a ``*`` that would open emphasis are escaped outside inline
  literals.
"""
from __future__ import annotations

import re

_STAR = re.compile(r"(?<![\*\\])\*(?=[^\s\*])")
_BAR = re.compile(r"(?<!\\)\|")


def _escape(line: str) -> str:
    parts = line.split("``")
    for i in range(0, len(parts), 2):  # even parts are outside ``inline literals``
        parts[i] = _BAR.sub(r"\\|", _STAR.sub(r"\\*", parts[i]))
    return "``".join(parts)


def process(app, what, name, obj, options, lines):
    if what == "module":
        end = next((i for i, line in enumerate(lines)
                    if not line.strip() or line.startswith((" ", "\t"))), len(lines))
        head = [_escape(line) for line in lines[:end]]
        rest = lines[end:]
        while rest and not rest[0].strip():
            rest.pop(0)
        lines[:] = head + [""] + (["::", ""] + ["    " + line for line in rest] + [""]
                                  if rest else [])
        return
    lines[:] = [_escape(line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", process, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
