"""Every equation tag in the code is a numbered equation of a derivation note: a comment
``# ... (name.N)`` anywhere under refbayes/ needs the label ``(name.N)`` at the start or the end
of a line of derivations/<name>.md (the note's numbered equation, not a mention in passing)."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = re.compile(r"\(([a-z_]+)\.(\d+)\)")

# Tag prefixes whose equations live in a note of another name (refbayes verify names the note too).
from refbayes.tracing import NOTE_OF  # noqa: E402


def _code_tags() -> dict:
    """{(name, N): first 'path:line'} over the comments of refbayes/**.py."""
    tags = {}
    for path in sorted((ROOT / "refbayes").rglob("*.py")):
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            _, hash_, comment = line.partition("#")
            for m in TAG.finditer(comment if hash_ else ""):
                tags.setdefault((m.group(1), int(m.group(2))),
                                f"{path.relative_to(ROOT)}:{lineno}")
    return tags


def _labels(note: Path) -> set:
    """The labels a note numbers: '(name.N)' opening or closing one of its lines."""
    out = set()
    for line in note.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        for m in (re.match(r"\(([a-z_]+)\.(\d+)\)", line), re.search(r"\(([a-z_]+)\.(\d+)\)$", line)):
            if m:
                out.add((m.group(1), int(m.group(2))))
    return out


def test_every_code_tag_is_numbered_in_its_derivation_note():
    tags = _code_tags()
    assert len(tags) > 100, "found almost no tags: the pattern above is stale"
    missing = []
    for (name, n), where in sorted(tags.items()):
        note = ROOT / "derivations" / f"{NOTE_OF.get(name, name)}.md"
        if not note.is_file():
            missing.append(f"({name}.{n}) at {where}: no note {note.relative_to(ROOT)}")
        elif (name, n) not in _labels(note):
            missing.append(f"({name}.{n}) at {where}: not numbered in {note.relative_to(ROOT)}")
    assert not missing, "\n".join(missing)


def test_the_uci_protocol_tags_are_covered():
    tags = _code_tags()
    assert ("uci", 1) in tags and ("uci", 2) in tags  # the metrics of experiments/uci.py
    assert {("uci", 1), ("uci", 2)} <= _labels(ROOT / "derivations" / "uci.md")
