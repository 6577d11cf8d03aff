"""Equation tags: read off the State / Info field comments, and the derivation note of each.

The one source of a traced quantity's tag is the trailing comment of its NamedTuple field, e.g.
``g_hat: Array  # (D,)  (ngvi.8) / (ngvi.11)``; nothing restates it.
"""
from __future__ import annotations

import functools
import inspect
import re

__all__ = ["LABEL", "NOTE_OF", "TAG_EXPR", "derivation_of", "field_tags"]

# One equation label, e.g. (vogn.5); a tag expression is one label or a range or alternative of
# labels as the comments write them: (ngvi.9)-(ngvi.11), (ngvi.8) / (ngvi.11).
LABEL = re.compile(r"\((\w+\.\d+)\)")
TAG_EXPR = re.compile(r"\(\w+\.\d+\)(?:\s*[-/]\s*\(\w+\.\d+\))*")
# tag prefixes whose note has another name: Adam's equations are derived in the BBB note
NOTE_OF = {"adam": "bbb", "data": "datasets", "peg": "per_example_gradients"}


@functools.lru_cache(maxsize=None)
def field_tags(cls) -> dict:
    """Read the equation tags off a NamedTuple's field comments.

    Every State / Info class of refbayes.methods ends each field line with a comment naming its
    equations, e.g. ``g_hat: Array  # ghat, (D,) (vogn.5), (vogn.6)``.

    Parameters
    ----------
    cls : type
        A NamedTuple class.

    Returns
    -------
    dict of str to str
        Field name to its tags joined by ', ' (e.g. '(vogn.5), (vogn.6)'), '' for none.
    """
    tags = dict.fromkeys(cls._fields, "")
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"\s+(\w+)\s*:[^#]*#(.*)$", line)
        if m and m.group(1) in tags:
            tags[m.group(1)] = ", ".join(TAG_EXPR.findall(m.group(2)))
    return tags


def derivation_of(tag: str, default: str) -> str:
    """Name the derivation note of a tag: '(vogn.5)' is derived in derivations/vogn.md.

    Parameters
    ----------
    tag : str
        One or more tags, e.g. '(bbb.4)' or '(ngvi.8) / (ngvi.11)'; the first decides.
    default : str
        The note to name when the tag is empty.

    Returns
    -------
    str
        The note's path relative to the repository root.
    """
    found = LABEL.findall(tag)
    if not found:
        return default
    prefix = found[0].split(".")[0]
    return f"derivations/{NOTE_OF.get(prefix, prefix)}.md"
