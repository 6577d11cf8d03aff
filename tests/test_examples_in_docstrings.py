"""Every public module of refbayes.methods shows how it is used: an Examples section at the end of
its module docstring (numpydoc), whose doctests run here, so a broken example fails the suite.

The examples take one step (or a fit) on a tiny problem: 20 synthetic points
(``refbayes.datasets.make_logistic_regression`` / ``make_linear_regression``), the minibatch and
every standard-normal draw made by the caller from a ``numpy.random.Generator`` (a step draws
nothing), and print shapes, booleans or rounded numbers only, so their output does not depend on
the platform's last bits. A warning raised by an example fails it: an example must not teach a
call that the library warns about.
"""
from __future__ import annotations

import doctest
import importlib
import io
import pkgutil
import warnings

import pytest

# numpydoc is a test extra; an image without it (the GPU image) skips this module, not the run.
pytest.importorskip("numpydoc", reason="numpydoc (the test extra) is not installed")
from numpydoc.docscrape import NumpyDocString

import refbayes.methods

MODULES = sorted(f"refbayes.methods.{m.name}"
                 for m in pkgutil.iter_modules(refbayes.methods.__path__)
                 if not m.name.startswith("_"))


def test_every_method_module_is_covered():
    assert len(MODULES) >= 18 and "refbayes.methods.swag" in MODULES
    assert "refbayes.methods.vogn" in MODULES and "refbayes.methods.laplace" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_docstring_ends_with_a_numpydoc_examples_section(name):
    doc = importlib.import_module(name).__doc__
    assert "\nExamples\n--------\n" in doc, f"{name}: no Examples section in the module docstring"
    parsed = NumpyDocString(doc)  # raises on a malformed section
    assert parsed["Examples"], name
    # the last section: nothing after it would be read as part of the examples
    after = doc.split("\nExamples\n--------\n", 1)[1]
    assert not any(line.strip() and set(line.strip()) == {"-"} for line in after.splitlines()), name
    assert ">>> " in after, f"{name}: the Examples section has no doctest"


@pytest.mark.parametrize("name", MODULES)
def test_module_docstring_examples_run(name):
    module = importlib.import_module(name)
    # the module docstring only (recurse=False): functions keep their own docstrings
    tests = doctest.DocTestFinder(recurse=False).find(module, name)
    tests = [t for t in tests if t.examples]
    assert len(tests) == 1 and len(tests[0].examples) >= 3, name
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = runner.run(tests[0], out=out.write)
    assert result.failed == 0, out.getvalue()


def test_a_failing_example_is_reported():
    """The runner above fails on a wrong output (the check cannot pass vacuously)."""
    test = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "t", None, 0)
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=out.write)
    assert result.failed == 1 and "Expected:\n    3\nGot:\n    2" in out.getvalue()


def test_sgd_step_documents_its_none_noise_argument():
    """swag.sgd_step's dummy noise is the uniform step contract (``_protocol``), which the
    record and the driver call positionally; its docstring and the module's example say so."""
    import inspect

    from numpydoc.docscrape import FunctionDoc

    from refbayes.methods import records, swag
    assert list(inspect.signature(swag.sgd_step).parameters) == ["state", "batch", "noise", "cfg",
                                                                  "model"]
    assert records.RECORDS["sgd"].step is swag.sgd_step
    noise = next(p for p in FunctionDoc(swag.sgd_step)["Parameters"] if p.name == "noise")
    text = " ".join(noise.desc)
    assert "sgd_step(state, batch, None, cfg, model)" in text and "_protocol" in text
    assert "swag.sgd_step(sgd, batch, None, sgd_cfg, model)" in swag.__doc__
