"""The README claims only what exists: every path it (or a documentation page) names is in the
tree, and the methods its opening lists as implemented are exactly those whose module exists (the
others are in the Roadmap section of docs/roadmap.md). It stays a newcomer's page: under 120
lines, the details in docs/. Its commands are checked by tests/test_docs.py."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
ROADMAP = (ROOT / "docs" / "roadmap.md").read_text(encoding="utf-8")
# the hand-written documentation pages (docs/api, docs/derivations, docs/tutorials are generated)
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
         for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}

# Method name as the README writes it -> the module that implements it (DESIGN.md's layout).
PLANNED_OR_DONE = {
    "Noisy K-FAC": "refbayes/methods/noisy_kfac.py",
    "k-tied Normal": "refbayes/methods/ktied.py",
    "SWA/SWAG": "refbayes/methods/swag.py",
    "Riemannian\nLaplace approximation": "refbayes/methods/riemannian_laplace.py",
    "Laplace": "refbayes/methods/laplace.py",
}


def _paragraphs():
    """(the README's opening, before its first section; docs/roadmap.md's "## Roadmap" section)."""
    implemented = README.split("\n## ")[0]
    _, found, rest = ROADMAP.partition("\n## Roadmap\n")
    assert found, "docs/roadmap.md: what is planned belongs in a '## Roadmap' section"
    return implemented, rest.split("\n## ")[0]


def _mentions(text: str, name: str, *, partial_ok: bool = False) -> bool:
    # The README wraps lines at 100 columns, so a name may be split at any space.
    pattern = r"\s+".join(map(re.escape, name.split()))
    if partial_ok:  # "the rest of [the] NAME": what is left of a method that exists in part
        text = re.sub(r"the\s+rest\s+of\s+(?:the\s+)?" + pattern, "", text)
    if name == "Laplace":  # not the 'Laplace' inside 'Riemannian Laplace approximation'
        text = re.sub(r"Riemannian\s+Laplace", "", text)
    return re.search(pattern, text) is not None


@pytest.mark.parametrize("name", PLANNED_OR_DONE)
def test_first_paragraph_lists_a_method_only_when_its_module_exists(name):
    implemented, roadmap = _paragraphs()
    exists = (ROOT / PLANNED_OR_DONE[name]).is_file()
    assert _mentions(implemented, name) == exists, (
        f"README's first paragraph {'omits' if exists else 'lists'} {name!r}, but "
        f"{PLANNED_OR_DONE[name]} {'exists' if exists else 'does not exist'}")
    # An implemented method may stay on the roadmap only as "the rest of NAME".
    assert _mentions(roadmap, name, partial_ok=exists) == (not exists), (
        f"docs/roadmap.md's roadmap {'lists' if exists else 'omits'} {name!r}")


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_path_a_page_names_exists(page):
    text = PAGES[page]
    named = set(re.findall(r"`((?:refbayes|derivations|tests|asv_benchmarks|examples|tools|docs|"
                           r"reproductions)/[^`*\s<]+)`", text))
    # relative links of the README ([slang.py](refbayes/methods/slang.py)), not web addresses
    if page == "README.md":
        named |= {link for link in re.findall(r"\]\(([^)#\s]+)\)", text) if "://" not in link}
    named = {p for p in named if not p.startswith("docs/_build/")}  # the build's output
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"{page} names paths that do not exist: {missing}"


def test_readme_names_paths():
    assert re.search(r"\]\(refbayes/methods/\w+\.py\)", README), "the pattern above is stale"


def test_readme_is_short():
    lines = README.splitlines()
    assert len(lines) < 120, f"README.md has {len(lines)} lines: move the details to docs/"


def test_quoted_run_times_are_the_measured_ones():
    # docs/commands.md (moved from the README) and the --help texts quote one measurement
    # (slang_logreg.MEASURED_SECONDS); the figures once drifted 2x from reality, so they are
    # stated once and checked here.
    from refbayes.experiments.slang_logreg import MEASURED_SECONDS, _about

    text = " ".join(PAGES["docs/commands.md"].split())
    for run, seconds in MEASURED_SECONDS.items():
        assert f"{_about(seconds)} on 2 cores" in text, run
        assert f" {seconds} s" in text, f"{run}: the measured {seconds} s is not in docs/commands.md"


def test_dataset_names_the_pages_give_commands_exist():
    """`--dataset X|Y` of `refbayes reproduce calibration` and `refbayes data fetch NAME` in the
    pages name real datasets: the subset is `mnist-5k` in both, `mnist` is full MNIST."""
    from refbayes.datasets import dataset_names
    from refbayes.experiments import calibration
    data = set(dataset_names(include_optional=True))
    seen = 0
    for page, text in PAGES.items():
        text = " ".join(text.split())
        for names in re.findall(r"refbayes reproduce calibration \[?--dataset ([\w|,-]+)", text):
            for name in re.split(r"[|,]", names):
                seen += 1
                assert name in (*calibration.DATASETS, "all"), \
                    f"{page}: calibration --dataset {name}"
        for name in re.findall(r"`refbayes data fetch ([a-z][\w-]*)`", text):
            assert name in data, f"{page}: refbayes data fetch {name}"
    assert seen >= 3
