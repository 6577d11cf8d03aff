"""The README claims only what exists: every path it names is in the tree, and the methods its
opening lists as implemented are exactly those whose module exists (the others are in its Roadmap
section)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

# Method name as the README writes it -> the module that implements it (DESIGN.md's layout).
PLANNED_OR_DONE = {
    "Noisy K-FAC": "refbayes/methods/noisy_kfac.py",
    "k-tied Normal": "refbayes/methods/ktied.py",
    "SWA/SWAG": "refbayes/methods/swag.py",
    "Riemannian\nLaplace approximation": "refbayes/methods/riemannian_laplace.py",
    "Laplace": "refbayes/methods/laplace.py",
}


def _paragraphs():
    """(the opening, before the first heading; the "## Roadmap" section)."""
    implemented = README.split("\n## ")[0]
    _, found, rest = README.partition("\n## Roadmap\n")
    assert found, "README: what is planned belongs in a '## Roadmap' section"
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
        f"README's roadmap line {'lists' if exists else 'omits'} {name!r}")


def test_every_path_the_readme_names_exists():
    named = set(re.findall(r"`((?:refbayes|derivations|tests|asv_benchmarks)/[^`*\s]+)`", README))
    assert named, "README names no paths: the pattern above is stale"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"README names paths that do not exist: {missing}"


def test_quoted_run_times_are_the_measured_ones():
    # The README and the --help texts quote one measurement (slang_logreg.MEASURED_SECONDS);
    # the figures once drifted 2x from reality, so they are stated once and checked here.
    from refbayes.experiments.slang_logreg import MEASURED_SECONDS, _about

    text = " ".join(README.split())
    for run, seconds in MEASURED_SECONDS.items():
        assert f"{_about(seconds)} on 2 cores" in text, run
        assert f" {seconds} s" in text, f"{run}: the measured {seconds} s is not in the README"
