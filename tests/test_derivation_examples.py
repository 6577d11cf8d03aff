"""The worked examples of derivations/ run (issue 38, item 5): every fenced ```python block of
every note is executed in a fresh namespace, and each method's note has a "Worked example" section
whose block runs the package's own code on a tiny input and asserts numbers worked out by hand
in the note."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTES = sorted((ROOT / "derivations").glob("*.md"))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
HEADING = re.compile(r"^## Worked example", re.M)

# the methods' notes: each has its worked example of the method's central equation
METHOD_NOTES = ("bbb", "exact_vi", "ktied", "laplace", "mc_dropout", "ngvi", "noise_gamma",
                "noisy_adam", "noisy_kfac", "riemannian_laplace", "slang", "swag", "vadam", "vogn")


def blocks(path: Path) -> list[tuple[int, str]]:
    """(line, code) of each ```python block of a note."""
    text = path.read_text(encoding="utf-8")
    return [(text[:m.start()].count("\n") + 2, m.group(1)) for m in BLOCK.finditer(text)]


CASES = [(p, line, code) for p in NOTES for line, code in blocks(p)]


@pytest.mark.parametrize("path, line, code", CASES,
                         ids=[f"{p.stem}:{line}" for p, line, _ in CASES])
def test_each_python_block_of_a_note_runs(path, line, code):
    exec(compile(code, f"{path.relative_to(ROOT)}:{line}", "exec"), {"__name__": "__example__"})


@pytest.mark.parametrize("stem", METHOD_NOTES)
def test_each_method_note_has_a_worked_example_that_asserts(stem):
    text = (ROOT / "derivations" / f"{stem}.md").read_text(encoding="utf-8")
    m = HEADING.search(text)
    assert m, f"derivations/{stem}.md: no '## Worked example' section"
    section = text[m.start():]
    nxt = re.search(r"^## ", section[3:], re.M)
    section = section if nxt is None else section[:nxt.start() + 3]
    code = "".join(c for c in BLOCK.findall(section))
    assert "assert" in code and "refbayes" in code, (
        f"derivations/{stem}.md: the worked example must run refbayes and assert its numbers")
