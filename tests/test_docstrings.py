"""The public API of refbayes.linalg, refbayes.models and refbayes.methods has numpydoc docstrings.

The public API is every name in the ``__all__`` of a public module of the three subpackages
(modules whose name starts with ``_`` are private; what a public module re-exports from one is
public), plus the public methods and properties of the public classes.  Each object goes through
``numpydoc.validate.validate``; the test fails on any error code in ``ENFORCED``.

Documentation is written once.  A NamedTuple documents its fields in one place: State / Config /
Info classes in the trailing comment of each field line (``field_tags``, in refbayes.tracing.tags and
re-exported by refbayes.golden, reads the equation tags from those comments), other NamedTuples either so or in an Attributes section, never
both.  A Raises paragraph is not pasted: the validity rules of a State / Config (or of a model's
inputs) are stated once, in the class (or module) docstring, and each function's Raises names it
("If state or cfg is invalid (see SLANGState, SLANGConfig)"); such a "(see ...)" must resolve.
"""
from __future__ import annotations

import ast
import collections
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
import textwrap

import pytest

# numpydoc is a test extra; an image without it (the GPU image) skips this module, not the run.
pytest.importorskip("numpydoc", reason="numpydoc (the test extra) is not installed")
import numpydoc.validate
from numpydoc.docscrape import ClassDoc, FunctionDoc

PACKAGES = ("refbayes.linalg", "refbayes.models", "refbayes.methods", "refbayes.tracing")

# Codes that fail the test, one reason each.
ENFORCED = {
    "GL03": "one blank line between paragraphs, so help() output stays compact",
    "GL05": "no tabs: indentation must parse the same everywhere",
    "GL06": "only numpydoc section names, or the section is silently dropped by renderers",
    "GL07": "sections in numpydoc order (Parameters, Attributes, Returns, Raises, ..., Notes)",
    "GL08": "every public object has a docstring",
    "GL10": "reST directives take two colons or they render as text",
    "SS01": "a summary line: what help() and IDE tooltips show first",
    "SS02": "the summary starts with a capital letter (a sentence, not a formula)",
    "SS03": "the summary ends with a period",
    "SS04": "no leading whitespace in the summary",
    "SS05": "function summaries use the imperative ('Return', not 'Returns')",
    "SS06": "the summary fits on one line; the formula goes in the extended summary",
    "PR01": "every parameter of the signature is documented",
    "PR02": "no documented parameter is missing from the signature (stale docs)",
    "PR03": "parameters are documented in signature order",
    "PR04": "every parameter has a type (with its shape for arrays)",
    "PR05": "a parameter type does not end with a period",
    "PR06": "types use int / bool / str, not integer / boolean / string",
    "PR07": "every parameter has a description",
    "PR08": "parameter descriptions start with a capital letter",
    "PR09": "parameter descriptions end with a period",
    "PR10": "'name : type' with a space before the colon, or the type is lost",
    "RT01": "a function that returns a value has a Returns section",
    "RT02": "a single return value is given by its type (names only for tuples)",
    "RT03": "every return value has a description",
    "RT04": "return descriptions start with a capital letter",
    "RT05": "return descriptions end with a period",
    "YD01": "a generator documents what it yields",
}

# Codes deliberately not enforced, one reason each.
NOT_ENFORCED = {
    "GL01": "house style opens the summary on the line of the opening quotes",
    "GL02": "closing-quote placement is cosmetic and not shown by help()",
    "GL09": "nothing in these packages is deprecated",
    "ES01": "a one-line summary plus Parameters/Returns is enough for simple functions",
    "SA01": "See Also is optional: derivations/*.md and the module docstrings are the map",
    "SA02": "only matters where See Also exists (not required)",
    "SA03": "only matters where See Also exists (not required)",
    "SA04": "only matters where See Also exists (not required)",
    "EX01": ("a method module's examples are in its module docstring (one Examples section, run by "
             "tests/test_examples_in_docstrings.py); one per function would repeat them"),
}

# A NamedTuple's fields are documented once, by their trailing comments or under Attributes (its
# constructor arguments are the same names); repeating them under Parameters would only invite
# the lists to drift.
NAMEDTUPLE_EXEMPT = {"PR01", "PR02", "PR03"}


def _public_modules():
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        yield pkg
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            if not any(part.startswith("_") for part in info.name.split(".")):
                yield importlib.import_module(info.name)


def _is_namedtuple(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields")


def _own_members(cls):
    """Public methods and properties a refbayes class defines or inherits from a refbayes class."""
    if _is_namedtuple(cls):
        return  # _make, _replace, count, index and the field accessors are not API
    for klass in cls.__mro__:
        if not klass.__module__.startswith("refbayes."):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                yield f"{klass.__module__}.{klass.__qualname__}.{name}", member


def _collect():
    """{qualified name: object}, one entry per object however many modules export it."""
    found = {}
    for mod in _public_modules():
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # submodules (validated on their own) and constants (tuples, floats)
            found[f"{obj.__module__}.{obj.__qualname__}"] = obj
            if inspect.isclass(obj):
                found.update(_own_members(obj))
    return dict(sorted(found.items()))


API = _collect()
NAMEDTUPLES = [q for q, obj in API.items() if _is_namedtuple(obj)]


def test_api_is_found():
    # Guards the collection itself: an import change that emptied __all__ would pass vacuously.
    assert len(API) > 100
    assert "refbayes.linalg.lowrank.solve" in API
    assert "refbayes.methods.vogn.VOGNState" in NAMEDTUPLES
    assert len(RAISES) > 100
    assert "refbayes.models.base.FlatModel.forward" in API


@pytest.mark.parametrize("qualname", list(API))
def test_numpydoc(qualname):
    result = numpydoc.validate.validate(qualname)
    enforced = set(ENFORCED) - (NAMEDTUPLE_EXEMPT if _is_namedtuple(API[qualname]) else set())
    errors = [f"{code}: {msg}" for code, msg in result["errors"] if code in enforced]
    assert not errors, f"{qualname} ({result['file']}:{result['file_line']}):\n  " + \
        "\n  ".join(errors)


# The field-line pattern of field_tags (refbayes.tracing.tags): the tags come from that comment.
_FIELD_LINE = re.compile(r"\s+(\w+)\s*:[^#]*#(.*)$")


def _field_comments(cls) -> dict:
    """{field: its trailing comment}, read off the class source as ``field_tags`` reads it."""
    comments = {}
    for line in inspect.getsource(cls).splitlines():
        m = _FIELD_LINE.match(line)
        if m and m.group(1) in cls._fields and m.group(1) not in comments:
            comments[m.group(1)] = m.group(2).strip()
    return comments


@pytest.mark.parametrize("qualname", NAMEDTUPLES)
def test_namedtuple_fields_documented_once(qualname):
    cls = API[qualname]
    attributes = ClassDoc(cls, config={"show_class_members": False})["Attributes"]
    comments = _field_comments(cls)
    if cls.__name__.endswith(("State", "Config", "Info")) or comments:
        assert not attributes, (
            f"{qualname}: fields documented twice, in an Attributes section and in trailing "
            "comments; keep the comments (field_tags reads the equation tags from them)")
        missing = [f for f in cls._fields if not comments.get(f)]
        assert not missing, f"{qualname}: fields without a trailing comment: {missing}"
        return
    documented = [name for name, _, _ in attributes]
    assert documented == list(cls._fields), (
        f"{qualname}: the Attributes section must list exactly the fields, in order; "
        f"fields {list(cls._fields)}, documented {documented}")
    incomplete = [name for name, type_, desc in attributes if not type_ or not "".join(desc).strip()]
    assert not incomplete, f"{qualname}: attributes without a type or a description: {incomplete}"


def _raises():
    """{qualname: [(exception, description lines)]} over the public functions and methods."""
    out = {}
    for qualname, obj in API.items():
        func = obj.fget if isinstance(obj, property) else obj
        if inspect.isfunction(func):
            entries = FunctionDoc(func)["Raises"]
            if entries:
                out[qualname] = [(e.type or e.name, [line.strip() for line in e.desc]) for e in entries]
    return out


RAISES = _raises()
CLASSES = {obj.__name__: obj for obj in API.values() if inspect.isclass(obj)}


def test_no_raises_paragraph_is_pasted():
    # Three lines in a row, identical in the Raises of two docstrings of one module, are a pasted
    # paragraph: rules that belong once in a class or module docstring (see the module docstring
    # above).  Windows of three lines also catch a pasted paragraph followed by different tails.
    seen = collections.defaultdict(set)
    for qualname, entries in RAISES.items():
        obj = API[qualname]
        module = (obj.fget if isinstance(obj, property) else obj).__module__
        for exc, desc in entries:
            for i in range(len(desc) - 2):
                seen[(module, exc, "\n".join(desc[i:i + 3]))].add(qualname)
    pasted = [f"{module}: {exc} lines in {len(names)} docstrings ({', '.join(sorted(names))}):\n"
              f"    {text}" for (module, exc, text), names in seen.items() if len(names) > 1]
    assert not pasted, "\n".join(pasted)


@pytest.mark.parametrize("qualname", [q for q, e in RAISES.items()
                                      if any("(see " in " ".join(d) for _, d in e)])
def test_raises_references_resolve(qualname):
    # "(see SLANGState, SLANGConfig)" must name classes or modules that exist, so the rules the
    # reader is sent to are there.
    obj = API[qualname]
    func = obj.fget if isinstance(obj, property) else obj
    namespace = sys.modules[func.__module__].__dict__
    for _, desc in RAISES[qualname]:
        for group in re.findall(r"\(see ([^)]*)\)", " ".join(desc)):
            # the class names (XState, FlatModel) and refbayes module paths of the reference
            for name in re.findall(r"\b(?:refbayes(?:\.\w+)+|[A-Z]\w*[a-z]\w*)", group.split(";")[0]):
                if name.startswith("refbayes."):
                    module, _, attr = name.rpartition(".")
                    target = importlib.import_module(name) if importlib.util.find_spec(name) \
                        else getattr(importlib.import_module(module), attr, None)
                else:  # a name of the function's module, or a public class of the API (Batch)
                    target = namespace.get(name) or CLASSES.get(name)
                assert target is not None, f"{qualname}: Raises names {name}, which is not found"
                assert "ValueError" in (inspect.getdoc(target) or ""), (
                    f"{qualname}: Raises sends the reader to {name}, whose docstring states no "
                    "validity rules (no 'ValueError')")


def _validates_input(func) -> bool:
    """The function body raises, or calls a check_* / _check_* validation helper."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise):
            return True
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name.lstrip("_").startswith("check"):
                return True
    return False


FUNCTIONS = [q for q, obj in API.items() if inspect.isfunction(obj) and _validates_input(obj)]


@pytest.mark.parametrize("qualname", FUNCTIONS)
def test_raises_documented(qualname):
    # numpydoc does not check Raises; a function that validates its input must say what it raises.
    raises = FunctionDoc(API[qualname])["Raises"]
    assert raises, f"{qualname}: validates its input (raise / check_*) but has no Raises section"
