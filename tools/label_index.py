"""The label index: every equation label of derivations/*.md, the code that computes it, the tests
that decide it. Writes docs/labels.md, which the docs build generates this way (docs/conf.py;
git-ignored, so it always matches the tree being built); tests/test_label_index.py checks that
every label has a code line and a deciding test (or a reason in EXCEPTIONS below).

Usage: python tools/label_index.py [--check]  (--check writes nothing and exits 1 on a problem)

Rules (the page repeats them):

- **Label**: ``(<prefix>.<n>)``. Its note is ``derivations/<prefix>.md``, or the one in NOTE_OF
  (three prefixes live in a note of another name). It is **defined** at its first occurrence in
  that note that starts a line (``(swag.1) Running mean ...``, the label alone on a line, a heading
  ``## (vadam.11) The reduction ...``) or ends
  one (the number of a displayed equation, ``... = vec(A X S^T)   (kron.2)``); a table row
  (``| (swag.1) | ...``) never defines. Every other occurrence, in any note, is a reference.
- **Tag**: a label written in a ``#`` comment or a docstring of a ``.py`` file under refbayes/ or
  tests/. ``(p.a)-(p.b)`` (or an en dash, or ``to``) tags every defined label p.a ... p.b.
  Labels in other strings (messages, trace tables) are not tags.
- **Code line**: a tag under refbayes/ in a comment, or in the docstring of a function or class,
  listed with the function (or class) around it. A tag in a module docstring does not count as a
  code line (it says which file, not which line); the page shows it only for a label with none.
- **Reading order**: each prefix's labels are defined as 1, 2, ..., n down its note, no gaps.
- **Paper line**: every label is covered by a line of its note that starts ``Paper:`` or ``Paper
  vs note:`` (what the paper prints there, or why there is nothing to quote); such a line covers
  the labels it names, or, naming none, the label defined last above it.
- **Deciding test**: a tag in a ``tests/**/test_*.py`` file, listed as the test around it
  (``file::test`` or ``file::Class::test``); a tag in that file's module docstring, or in a helper
  (a dense twin, a fixture) names the file. Tags in other files under tests/ (the dense oracles of
  tests/reference/, conftest.py) are listed as oracles and do not decide a label.
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["EXCEPTIONS", "NOTE_OF", "Index", "build", "main", "render"]

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "docs" / "labels.md"

# prefixes whose note is not derivations/<prefix>.md
NOTE_OF = {"adam": "bbb", "peg": "per_example_gradients", "data": "datasets"}

# THE exception table: label -> (what it lacks, why). "code": no code line; "test": no deciding
# test; "both"; "tag": a tag that names no label, on purpose. tests/test_label_index.py fails on
# an entry that is no longer needed, so the table only shrinks.
_DERIVED = "a step of the derivation; the lines it leads to carry their own labels"
_PROPERTY = "a property the note proves and the tests check; no line of code computes it"
_REDUCTION = "a reduction of one method to another, checked by running both; no line of its own"
EXCEPTIONS: dict[str, tuple[str, str]] = {
    # no code line: derivation steps and definitions
    "ngvi.1": ("code", "the objective; its maximiser is what the ngvi step's fixed point is tested to be"),
    "ngvi.2": ("both", _DERIVED + " ((ngvi.4)-(ngvi.5))"),
    "ngvi.3": ("both", _DERIVED + " ((ngvi.8)-(ngvi.10))"),
    "vadam.1": ("both", "the objective; " + _DERIVED + " ((vadam.3)-(vadam.9))"),
    "vadam.2": ("code", _DERIVED + " ((vadam.3)-(vadam.9), (vadam.11))"),
    # no code line: properties proved in the note, decided by tests
    "ktied.9": ("code", _PROPERTY),
    "riemannian_laplace.13": ("code", _PROPERTY),
    "riemannian_laplace.20": ("code", _PROPERTY),
    "swag.8": ("code", _PROPERTY),
    "swag.13": ("code", _PROPERTY + " (the tests solve the Lyapunov equation)"),
    "swag.14": ("code", _PROPERTY + " (the tests solve the Lyapunov equation)"),
    # no code line: reductions, decided by tests that run both methods
    "noisy_kfac.13": ("code", _REDUCTION),
    "noisy_kfac.14": ("code", _REDUCTION),
    "noisy_kfac.15": ("code", _REDUCTION),
    "noisy_kfac.16": ("code", _REDUCTION),
    "noisy_kfac.17": ("code", _REDUCTION),
    "noisy_kfac.18": ("code", _REDUCTION),
    "noisy_kfac.19": ("code", _REDUCTION),
    "vadam.11": ("code", _REDUCTION),
    "vogn.11": ("code", _REDUCTION),
    "vogn.12": ("code", _REDUCTION),
    # tags that name no label on purpose
    "toy.1": ("tag", "the synthetic two-line method of tests/test_records.py, not a note's label"),
    "toy.2": ("tag", "the synthetic two-line method of tests/test_records.py, not a note's label"),
}

LABEL = r"\(([a-z_][a-z_0-9]*)\.(\d+)\)"
_LABEL_RE = re.compile(LABEL)
_RANGE_RE = re.compile(LABEL + r"\s*(?:-|\u2013|--|to)\s*" + LABEL)


def _label(prefix: str, n: str) -> str:
    return f"{prefix}.{int(n)}"


def _sort_key(label: str):
    prefix, n = label.rsplit(".", 1)
    return prefix, int(n)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def labels_in(text: str, defined: set[str] | None = None) -> list[str]:
    """The labels a piece of text names, ranges expanded over ``defined`` (in order, once each)."""
    out: list[str] = []
    for m in _RANGE_RE.finditer(text):
        if m.group(1) == m.group(3) and int(m.group(2)) < int(m.group(4)):
            for n in range(int(m.group(2)) + 1, int(m.group(4))):
                label = _label(m.group(1), str(n))
                if defined is None or label in defined:
                    out.append(label)
    out += [_label(*m.groups()) for m in _LABEL_RE.finditer(text)]
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------- notes


@dataclass
class Label:
    label: str
    note: str          # derivations/<stem>.md
    line: int          # where it is defined
    text: str          # the defining line, stripped
    code: list = field(default_factory=list)      # (file, line, qualname, counts)
    tests: list = field(default_factory=list)     # (file, line, test id or file)
    oracles: list = field(default_factory=list)   # (file, line, qualname)
    paper: list = field(default_factory=list)     # lines of its note's "Paper" lines that cover it


def note_of(prefix: str) -> str:
    return f"derivations/{NOTE_OF.get(prefix, prefix)}.md"


def parse_notes(root: Path = ROOT) -> tuple[dict[str, Label], dict[str, list]]:
    """(defined labels, every label occurrence in the notes: label -> [(note, line)])."""
    defined: dict[str, Label] = {}
    seen: dict[str, list] = {}
    for path in sorted((root / "derivations").glob("*.md")):
        note = path.relative_to(root).as_posix()
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found = [(_label(*m.groups()), m) for m in _LABEL_RE.finditer(line)]
            for label, _ in found:
                seen.setdefault(label, []).append((note, lineno))
            stripped = line.strip()
            if not found or stripped.startswith("|"):
                continue
            for label, m in found:
                # at the start: followed by a blank or the line's end, not by ")", ",", "." or a
                # range dash (those continue a sentence of the line above)
                at_start = (line[:m.start()].strip().strip("#").strip() == ""  # a heading too
                            and line[m.end():m.end() + 1] in ("", " ", "\t"))
                at_end = line[m.end():].strip() == ""
                prefix = label.rsplit(".", 1)[0]
                if (at_start or at_end) and note == note_of(prefix) and label not in defined:
                    defined[label] = Label(label, note, lineno, stripped)
    _attach_paper_lines(root, defined)
    return defined, seen


PAPER_LINE = re.compile(r"^\s*(?:[-*]\s+)?(?:\*\*)?Paper(?: vs note)?:")


def _attach_paper_lines(root: Path, defined: dict[str, Label]) -> None:
    """A "Paper:" or "Paper vs note:" line covers the labels it names (ranges expanded), or, if it
    names none, the label defined last above it in its note."""
    by_note: dict[str, list[Label]] = {}
    for lab in defined.values():
        by_note.setdefault(lab.note, []).append(lab)
    for note, labs in by_note.items():
        labs.sort(key=lambda lab: lab.line)
        lines = (root / note).read_text(encoding="utf-8").splitlines()
        for lineno, line in enumerate(lines, 1):
            if not PAPER_LINE.match(line):
                continue
            named = [x for x in labels_in(line, set(defined)) if x in defined]
            if not named:
                above = [lab for lab in labs if lab.line <= lineno]
                named = [above[-1].label] if above else []
            for label in named:
                defined[label].paper.append(lineno)


# ---------------------------------------------------------------------------- python files


def _scopes(tree: ast.Module) -> list[tuple[int, int, str, ast.AST]]:
    """(first line, last line, qualname, node) of every function and class, outermost first."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out.append((first, child.end_lineno, name, child))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def _innermost(scopes, line):
    best = None
    for first, last, name, node in scopes:
        if first <= line <= last and (best is None or first >= best[0]):
            best = (first, last, name, node)
    return best


def python_tags(path: Path, defined: set[str]):
    """Every tag of one file: (label, line, kind, scope) with kind "comment" / "docstring" /
    "module" (the module docstring) and scope the innermost (first, last, qualname, node)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    scopes = _scopes(tree)
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            for label in labels_in(tok.string, defined):
                out.append((label, tok.start[0], "comment", _innermost(scopes, tok.start[0])))
    owners = [(tree, None)] + [(node, (a, b, n, node)) for a, b, n, node in scopes]
    for node, scope in owners:
        doc = ast.get_docstring(node, clean=False)
        if doc is None:
            continue
        const = node.body[0].value
        for offset, line in enumerate(doc.splitlines()):
            for label in labels_in(line, defined):
                out.append((label, const.lineno + offset, "module" if scope is None else
                            "docstring", scope))
    return out


def _test_id(rel: str, scope) -> str:
    """The test a tag sits in (file::test, file::Class::test), or the file for a helper."""
    if scope is None:
        return rel
    parts = scope[2].split(".")
    # the outermost test function that contains the tag (a nested helper inside a test counts
    # for that test)
    for i, part in enumerate(parts):
        if part.startswith("test"):
            owners = parts[:i]
            if all(p.startswith("Test") for p in owners):
                return "::".join([rel, *parts[: i + 1]])
            break
    return rel


# ---------------------------------------------------------------------------- the index


@dataclass
class Index:
    labels: dict[str, Label]
    unknown: list = field(default_factory=list)    # (file, line, label): a tag naming no label

    def problems(self) -> list[str]:
        """What tests/test_label_index.py fails on, one line each."""
        out = []
        for label, lab in sorted(self.labels.items(), key=lambda kv: _sort_key(kv[0])):
            lacks = []
            if not any(c[3] for c in lab.code):
                lacks.append("code")
            if not lab.tests:
                lacks.append("test")
            want = {(): None, ("code",): "code", ("test",): "test",
                    ("code", "test"): "both"}[tuple(lacks)]
            have = EXCEPTIONS.get(label, (None, ""))[0]
            if want != have:
                if want is None:
                    out.append(f"({label}): EXCEPTIONS says it lacks {have!r}, it does not "
                               "any more: remove the entry")
                else:
                    out.append(f"({label}) in {lab.note}:{lab.line}: no "
                               + " and no ".join({"code": "code line",
                                                  "test": "deciding test"}[x] for x in lacks)
                               + ("" if have is None else f" (EXCEPTIONS says {have!r})"))
        used_tags = set()
        for file, line, label in self.unknown:
            if EXCEPTIONS.get(label, ("",))[0] == "tag":
                used_tags.add(label)
            else:
                out.append(f"{file}:{line}: the tag ({label}) names no label of derivations/")
        for label, (kind, _) in EXCEPTIONS.items():
            if kind == "tag" and label not in used_tags:
                out.append(f"({label}): EXCEPTIONS lists a stray tag that no file has any more")
            if kind != "tag" and label not in self.labels:
                out.append(f"({label}): EXCEPTIONS lists a label that no note defines")
        return out + self.order_problems()

    def paper_problems(self) -> list[str]:
        """Issue 38, item 4: every label is covered by a "Paper:" / "Paper vs note:" line."""
        return [f"({lab.label}) in {lab.note}:{lab.line}: no 'Paper:' or 'Paper vs note:' line "
                "covers it" for lab in sorted(self.labels.values(),
                                              key=lambda lab: _sort_key(lab.label))
                if not lab.paper]

    def order_problems(self) -> list[str]:
        """Labels in reading order: each prefix's labels are defined as 1, 2, ..., n down its note."""
        out = []
        by_prefix: dict[str, list] = {}
        for lab in self.labels.values():
            by_prefix.setdefault(lab.label.rsplit(".", 1)[0], []).append(lab)
        for prefix, labs in sorted(by_prefix.items()):
            labs.sort(key=lambda lab: lab.line)
            for want, lab in enumerate(labs, 1):
                if _sort_key(lab.label)[1] != want:
                    out.append(f"({lab.label}) in {lab.note}:{lab.line}: defined where "
                               f"({prefix}.{want}) belongs (labels number 1, 2, ... in reading "
                               "order, with no gaps)")
                    break
        return out


def build(root: Path = ROOT) -> Index:
    defined, seen = parse_notes(root)
    names = set(defined)
    index = Index(defined)
    for label in sorted(set(seen) - names, key=_sort_key):
        for note, line in seen[label]:
            index.unknown.append((note, line, label))
    for top in ("refbayes", "tests"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for label, line, kind, scope in python_tags(path, names):
                if label not in defined:
                    index.unknown.append((rel, line, label))
                    continue
                lab = defined[label]
                qual = "<module>" if scope is None else scope[2]
                if top == "refbayes":
                    lab.code.append((rel, line, qual, kind != "module"))
                elif path.name.startswith("test_"):
                    lab.tests.append((rel, line, _test_id(rel, scope)))
                else:
                    lab.oracles.append((rel, line, qual))
    for lab in defined.values():
        lab.code.sort(key=lambda c: (c[0], c[1]))
        lab.tests.sort(key=lambda t: (t[0], t[1]))
        lab.oracles.sort(key=lambda t: (t[0], t[1]))
    index.unknown.sort()
    return index


# ---------------------------------------------------------------------------- the page


def _cell(items: list[str]) -> str:
    return "<br>".join(items) if items else "-"


def _by_file(entries) -> str:
    """[(file, line, name)] -> one item per file: ``file``: `name` lines; `name` lines."""
    files: dict[str, dict[str, list]] = {}
    for file, line, name in entries:
        files.setdefault(file, {}).setdefault(name, []).append(line)
    items = []
    for file, names in files.items():
        parts = [f"`{name}` {', '.join(map(str, lines))}" for name, lines in names.items()]
        items.append(f"`{file}`: " + "; ".join(parts))
    return _cell(items)


def _code_cell(lab: Label) -> str:
    """The code lines; tags in module docstrings only where there is no code line."""
    lines = [(f, n, q) for f, n, q, counts in lab.code if counts]
    if not lines:
        return _by_file([(f, n, "module docstring") for f, n, _, _ in lab.code])
    return _by_file(lines)


def _test_cell(lab: Label) -> str:
    by_test: dict[str, list] = {}
    for _, line, test in lab.tests:
        by_test.setdefault(test, []).append(line)
    return _cell([f"`{test}` (line {', '.join(map(str, lines))})"
                  for test, lines in by_test.items()])


def _oracle_cell(lab: Label) -> str:
    return _by_file(lab.oracles)


def _escape(text: str, limit: int | None = 90) -> str:
    text = " ".join(text.split()).replace("|", "\\|").replace("`", "'")
    text = text.replace("*", "\\*").replace("_", "\\_").replace("$", "\\$")
    text = text.replace("<", "&lt;").replace(">", "&gt;")
    return text if limit is None or len(text) <= limit else text[:limit - 3] + "..."


_HEADER = """\
# Label index

<!-- generated by tools/label_index.py at each docs build (docs/conf.py): do not edit -->

Every equation label of the derivation notes, the code lines tagged with it and the tests that
decide it, read from the tags by `python tools/label_index.py` when the documentation is built
(`--check` reports the problems only). {n} labels in {notes} notes; {code} with a code line, {test} with a
deciding test; {exc} labels are exceptions, each with its reason in the row.

- **Defined**: the first line of the label's note that starts (after a heading's `#`) or ends with
  the label (a numbered step, or a displayed equation's number); table rows never define.
- **Code**: a `# (label)` comment, or the docstring of a function or class, under `refbayes/`,
  listed by file and function; a tag only in a module docstring is not a code line (it is listed
  only where there is no code line). A range `(p.1)-(p.3)` tags each label in it.
- **Tests**: the test function around a tag in a `tests/**/test_*.py` file (the file, for a tag in
  its module docstring or in a helper such as a dense twin).
- **Oracles**: tags in the dense oracles of `tests/reference/` and other non-test files of
  `tests/`.
- **Exception**: a label without a code line or a deciding test, with the reason (`EXCEPTIONS` in
  the script).
"""


def render(index: Index) -> str:
    """The text of docs/labels.md."""
    labels = index.labels
    n_code = sum(any(c[3] for c in lab.code) for lab in labels.values())
    n_test = sum(bool(lab.tests) for lab in labels.values())
    notes: dict[str, list] = {}
    for label in sorted(labels, key=_sort_key):
        notes.setdefault(labels[label].note, []).append(labels[label])
    n_exc = sum(kind != "tag" for kind, _ in EXCEPTIONS.values())
    out = [_HEADER.format(n=len(labels), notes=len(notes), code=n_code, test=n_test,
                          exc=n_exc).rstrip("\n")]
    for note, labs in notes.items():
        prefixes = sorted({lab.label.rsplit(".", 1)[0] for lab in labs})
        out += ["", f"## {note.split('/')[1][:-3]}", "",
                f"`{note}`: " + ", ".join(f"({p}.*)" for p in prefixes)
                + f", {len(labs)} labels.", "",
                "| label | defined | code | tests | oracles |",
                "|---|---|---|---|---|"]
        for lab in labs:
            defined = f"line {lab.line}: {_escape(lab.text)}"
            tests = _test_cell(lab)
            code = _code_cell(lab)
            if lab.label in EXCEPTIONS:
                kind, why = EXCEPTIONS[lab.label]
                what = {"code": "no code line", "test": "no test",
                        "both": "no code line, no test"}[kind]
                note_text = f"*{what}*: {_escape(why, None)}"
                if kind in ("code", "both"):
                    code = note_text if code == "-" else f"{code}<br>{note_text}"
                if kind in ("test", "both"):
                    tests = note_text
            out.append(f"| ({lab.label}) | {defined} | {code} | {tests} | {_oracle_cell(lab)} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--papers", action="store_true",
                        help="print the labels no 'Paper:' line covers (and exit 1 if any)")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a label lacks a code line, a deciding "
                             "test or a Paper line, is out of reading order, or a tag names no "
                             "label")
    args = parser.parse_args(argv)
    index = build()
    if args.papers:
        missing = index.paper_problems()
        print("\n".join(missing) or "every label has its Paper line")
        return int(bool(missing))
    text = render(index)
    problems = index.problems() + index.paper_problems()
    for line in problems:
        print(line, file=sys.stderr)
    if args.check:
        return int(bool(problems))
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {_rel(OUTPUT)}: {len(index.labels)} labels, {len(problems)} problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
