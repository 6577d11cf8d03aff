"""The import graph of refbayes: no circles, layers kept, no lazy imports, no borrowed privates.

Each ``refbayes/**/*.py`` is parsed with ``ast``; nothing is imported. Every ``import`` and
``from ... import`` statement counts, at module level and inside functions alike (an import inside
a function closes a circle as surely as one at the top, only later). The rules:

a. **No circle** among refbayes modules. ``from P import x`` is an edge to the module ``P.x``
   when ``x`` is a submodule of ``P``, else to ``P``; ``import P.Q`` is an edge to ``P.Q``. The
   implicit import of a parent package (``refbayes.models`` before ``refbayes.models.base``) is
   not an edge: a package that imports its own submodules is no circle.
b. **No import from a higher layer** (:data:`LAYERS`, low to high). A module may import its own
   layer and the lower ones; the modules of one package (``refbayes.methods.*``) are one layer.
   A module that no entry of the table covers fails the test, so a new package gets a place.
c. **No import inside a function**, except of an optional extra (:data:`OPTIONAL_EXTRAS`: a
   module-level import would make it a hard dependency) and the named, measured exceptions of
   :data:`LAZY_IMPORTS`.
d. **No borrowed privates.** A name that starts with ``_`` (not a dunder) is private to the package
   it is defined in: a private module ``P._m`` may be imported only by modules inside ``P``
   (``refbayes._checks`` by every refbayes module, ``refbayes.models._layers`` only by
   ``refbayes.models.*``); a private attribute ``M._x`` only by the modules of ``M``'s package,
   where a top-level module such as ``refbayes.trace`` counts as its own package (refbayes' own
   top-level modules sit in different layers, they are not one package's siblings). Imports and
   attribute reads through a module name (``trace._problem()`` after ``from refbayes import
   trace``) both count.

``importlib.import_module("a.b")`` (or ``__import__``) with a literal name counts as ``import a.b``
where it is called; with a computed name (the registries of ``refbayes.experiments``,
``refbayes.conformance`` and ``refbayes.cli`` load their entries so, one at a time) it is not seen.

A failure lists every violation as ``refbayes/file.py:line: ...``. The checks themselves are tested
on small packages written to a temporary folder, so none of them passes vacuously.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Low to high. An entry covers the module of that name and everything under it ("refbayes" itself
# is only refbayes/__init__.py).
LAYERS = (
    ("refbayes.backend", "refbayes._files", "refbayes._tolerances", "refbayes._checks",
     "refbayes"),
    ("refbayes.linalg", "refbayes.metrics", "refbayes.datasets"),
    ("refbayes.models",),
    ("refbayes.methods",),
    ("refbayes.layout", "refbayes.conventions"),
    # refbayes.trace and refbayes.golden: the shims left where refbayes.tracing came from.
    ("refbayes.tracing", "refbayes.trace", "refbayes.golden", "refbayes.verify"),
    ("refbayes.experiments", "refbayes.conformance"),
    ("refbayes.cli",),
)

# Imported inside the functions that need them, so that refbayes runs without them: none is a
# dependency of refbayes (pyproject.toml [project.dependencies]); each belongs to an extra.
OPTIONAL_EXTRAS = {
    "torch": "extra 'conformance': refbayes.conformance runs the public PyTorch libraries",
    "laplace": "extra 'conformance' (laplace-torch), compared by refbayes.conformance",
    "ivon": "extra 'conformance' (ivon-opt), compared by refbayes.conformance",
    "backpack": "extra 'conformance' (backpack-for-pytorch), compared by refbayes.conformance",
    "curvlinops": "extra 'conformance' (curvlinops-for-pytorch), compared by refbayes.conformance",
    "mpi4py": "extra 'mpi': only refbayes.methods.vogn_mpi's multi-process all-reduce needs it",
    "distributed": "extra 'dask': the Dask runner of refbayes.experiments",
    "dask": "extra 'dask': the Dask runner of refbayes.experiments",
    "cupy": "extra 'gpu': CuPy is never required (refbayes.backend)",
    "cupyx": "extra 'gpu': CuPy's SciPy namespace, with CuPy",
    "matplotlib": "extra 'plot': only the figures need it",
}

# (importing module, imported module) -> why it is imported inside a function: a hard dependency
# or a refbayes module kept off the start-up path of the command line, for a measured cost.
# Measured with `python -X importtime -c "import refbayes.cli; import M"` (the cost of M on top of
# what `refbayes --help` already imports), OPENBLAS_NUM_THREADS=1, median of 7, on a shared
# 2-core machine (so +-50%): `import refbayes.cli` itself took 290-435 ms.
LAZY_IMPORTS = {
    ("refbayes.backend", "scipy.linalg"): (
        "every refbayes import runs backend (refbayes/__init__ -> _checks -> backend), so at "
        "module level scipy.linalg would load on `refbayes --help` and `refbayes data list`: "
        "+90 ms on top of `import refbayes.cli` (+170-380 ms on a bare `import refbayes`)"),
    ("refbayes.datasets.loaders", "scipy.io"): (
        "refbayes.cli imports refbayes.datasets at module level, and scipy.io pulls in "
        "scipy.sparse: +47 ms on `refbayes --help` (A/B of the two placements: median 605 vs "
        "508 ms), for the one reader (USPS's .mat file) that needs it"),
    ("refbayes.experiments._runner", "scipy.linalg"): (
        "refbayes.cli imports refbayes.experiments (the runner's --threads type and limit) at "
        "module level: +30 ms on `refbayes --help` (import time, median of 5); thread_limit "
        "imports it before limiting, so the limit reaches SciPy's own OpenBLAS"),
    ("refbayes.cli", "refbayes.tracing.cli"): (
        "refbayes.tracing imports every method, model and numba: +550-780 ms on `refbayes "
        "--help`, paid only by `refbayes trace`"),
}


# ----------------------------------------------------------------------------- reading the source

class Import(NamedTuple):
    importer: str        # dotted name of the module that holds the statement
    path: str            # its file, relative to the root
    line: int
    target: str          # the refbayes module it is an edge to, or the external module imported
    names: tuple         # dotted names it reads, for the privacy check (see _names_read)
    in_function: bool
    internal: bool       # target is a refbayes module


def module_files(root: Path, package: str = "refbayes") -> dict:
    """Dotted module name -> file, for every .py file of ``package`` under ``root``."""
    mods = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _is_package(mods: dict, name: str) -> bool:
    return name in mods and mods[name].name == "__init__.py"


def _longest_module(mods: dict, dotted: str):
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in mods:
            return ".".join(parts[:k])
    return None


def _resolve_relative(mods: dict, importer: str, module, level: int) -> str:
    if level == 0:
        return module
    base = importer.split(".") if _is_package(mods, importer) else importer.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


class _Collector(ast.NodeVisitor):
    """Import statements (with whether they sit inside a function) and ``alias.attr...`` reads."""

    def __init__(self):
        self.depth = 0
        self.imports = []     # (node, in_function)
        self.attributes = []  # ast.Attribute chains rooted at a Name

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node):
        self.imports.append((node, self.depth > 0))

    def visit_ImportFrom(self, node):
        self.imports.append((node, self.depth > 0))

    def visit_Call(self, node):
        """``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name is an
        import of ``a.b`` (it binds no name here)."""
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if (name in ("import_module", "__import__") and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            self.imports.append((ast.Import(names=[ast.alias(name=node.args[0].value, asname="")],
                                            lineno=node.lineno), self.depth > 0))
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if not isinstance(node.ctx, ast.Store):
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name):
                self.attributes.append((node.lineno, base.id, chain[::-1]))
                return  # the inner Attribute nodes are prefixes of this chain
        self.generic_visit(node)


def read_graph(root: Path, package: str = "refbayes"):
    """(modules, imports, attribute reads) of ``package`` under ``root``.

    Attribute reads are ``(importer, path, line, dotted)`` for ``name.a.b`` where ``name`` is
    bound by an import to a module of ``package`` (``dotted`` starts with that module's name).
    """
    mods = module_files(root, package)
    imports, reads = [], []
    for importer, file in mods.items():
        rel = file.relative_to(root).as_posix()
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=rel)
        col = _Collector()
        col.visit(tree)
        bound = {}  # local name -> dotted module it refers to (flow-insensitive, per file)
        for node, in_function in col.imports:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _longest_module(mods, alias.name)
                    internal = target is not None
                    imports.append(Import(importer, rel, node.lineno,
                                          target if internal else alias.name,
                                          (alias.name,), in_function, internal))
                    if alias.asname == "":  # a call of import_module: binds nothing
                        continue
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
                continue
            module = _resolve_relative(mods, importer, node.module, node.level)
            if module == "__future__":
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in mods:
                    target, internal = sub, True
                elif module in mods:
                    target, internal = module, True
                else:
                    target = _longest_module(mods, module)
                    internal = target is not None
                    target = target if internal else module
                imports.append(Import(importer, rel, node.lineno, target, (sub,), in_function,
                                      internal))
                bound[alias.asname or alias.name] = sub
        for line, name, chain in col.attributes:
            if name in bound and (bound[name] == package or bound[name].startswith(package + ".")):
                reads.append((importer, rel, line, ".".join([bound[name], *chain])))
    return mods, imports, reads


# ----------------------------------------------------------------------------- the four checks

def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def find_cycles(imports) -> list:
    """One message per strongly connected set of modules: its shortest circle, edge by edge."""
    edges = defaultdict(dict)  # module -> {target: first Import}
    for imp in imports:
        if imp.internal and imp.target != imp.importer:
            edges[imp.importer].setdefault(imp.target, imp)
    # Tarjan's strongly connected components, iteratively.
    index, low, stack, on_stack, sccs, counter = {}, {}, [], set(), [], [0]
    nodes = sorted(set(edges) | {t for e in edges.values() for t in e})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    scc.add(member)
                    if member == node:
                        break
                if len(scc) > 1:
                    sccs.append(scc)
    messages = []
    for scc in sccs:
        start = min(scc)
        # Shortest path start -> ... -> start inside the component (breadth first).
        prev, frontier, found = {start: None}, [start], None
        while frontier and found is None:
            nxt = []
            for node in frontier:
                for child in sorted(edges[node]):
                    if child not in scc:
                        continue
                    if child == start:
                        found = node
                        break
                    if child not in prev:
                        prev[child] = node
                        nxt.append(child)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        path = path[::-1] + [start]
        steps = [f"    {edges[a][b].path}:{edges[a][b].line}: {a} -> {b}"
                 f"{' (in a function)' if edges[a][b].in_function else ''}"
                 for a, b in zip(path, path[1:])]
        messages.append(f"circle {' -> '.join(path)} (component of {len(scc)} modules: "
                        f"{', '.join(sorted(scc))}):\n" + "\n".join(steps))
    return messages


def layer_of(module: str, layers=LAYERS):
    """(layer number, table entry) of ``module``: the longest entry that covers it, or None."""
    best = None
    for number, entries in enumerate(layers):
        for entry in entries:
            covers = module == entry if entry.count(".") == 0 else _within(module, entry)
            if covers and (best is None or len(entry) > len(best[1])):
                best = (number, entry)
    return best


def unplaced_modules(mods, layers=LAYERS) -> list:
    return [f"{mods[m].relative_to(ROOT) if mods[m].is_relative_to(ROOT) else mods[m]}: module "
            f"{m} is in no entry of LAYERS" for m in mods if layer_of(m, layers) is None]


def layer_violations(imports, layers=LAYERS) -> list:
    out = []
    for imp in imports:
        if not imp.internal:
            continue
        have, want = layer_of(imp.importer, layers), layer_of(imp.target, layers)
        if have is None or want is None or want[0] <= have[0]:
            continue
        out.append(f"{imp.path}:{imp.line}: {imp.importer} (layer {have[0]}, {have[1]}) imports "
                   f"{imp.target} (layer {want[0]}, {want[1]}), a higher layer")
    return out


def function_level_violations(imports, extras=OPTIONAL_EXTRAS, lazy=LAZY_IMPORTS) -> list:
    out = []
    for imp in imports:
        if not imp.in_function:
            continue
        top = imp.target.split(".")[0]
        if top in extras or (imp.importer, imp.target) in lazy:
            continue
        out.append(f"{imp.path}:{imp.line}: {imp.importer} imports {imp.target} inside a function "
                   "(move it to the top of the module, or state a measured reason in "
                   "LAZY_IMPORTS)")
    return out


def _private_owners(mods, dotted: str, package: str):
    """(private component, owning package) of every private name in ``dotted``.

    ``dotted`` is a module path optionally followed by attributes. A private module's owner is
    its parent package; a private attribute's is the package of the module it is read from (a
    module directly under ``package`` being its own). Past the first attribute that is no
    module (a class, a function) nothing more is judged.
    """
    parts = dotted.split(".")
    for k in range(1, len(parts)):
        comp, parent = parts[k], ".".join(parts[:k])
        if parent not in mods:
            return
        if not comp.startswith("_") or (comp.startswith("__") and comp.endswith("__")):
            continue
        if f"{parent}.{comp}" in mods:  # a private module
            yield comp, parent
        elif _is_package(mods, parent) or parent.count(".") == package.count(".") + 1:
            yield comp, parent
        else:
            yield comp, parent.rsplit(".", 1)[0]


def private_violations(mods, imports, reads, package: str = "refbayes") -> list:
    out = []
    uses = [(i.importer, i.path, i.line, "imports", d) for i in imports if i.internal
            for d in i.names]
    uses += [(importer, rel, line, "reads", d) for importer, rel, line, d in reads]
    for importer, rel, line, verb, dotted in uses:
        for comp, owner in _private_owners(mods, dotted, package):
            if not _within(importer, owner):
                out.append(f"{rel}:{line}: {importer} {verb} {dotted}: {comp} is private to "
                           f"{owner}")
    return out


# ----------------------------------------------------------------------------- refbayes itself

@pytest.fixture(scope="module")
def graph():
    return read_graph(ROOT)


def _by_place(message: str):
    path, line, _ = message.split(":", 2)
    return (path, int(line), message) if line.isdigit() else (message, 0, message)


def _fail(title: str, messages: list) -> None:
    """Fail listing every message once, by file and line number."""
    messages = sorted(set(messages), key=_by_place)
    if messages:
        pytest.fail(f"{title} ({len(messages)}):\n" + "\n".join(messages), pytrace=False)


def test_the_graph_is_read(graph):
    """The reader sees refbayes' imports (so the checks below are not vacuous)."""
    mods, imports, _ = graph
    edges = {(i.importer, i.target) for i in imports if i.internal}
    assert len(mods) > 50 and len(edges) > 150
    assert ("refbayes.methods.slang", "refbayes.linalg.lowrank") in edges
    assert ("refbayes", "refbayes._checks") in edges


def test_no_import_circle(graph):
    _, imports, _ = graph
    _fail("import circles among refbayes modules (module- and function-level imports)",
          find_cycles(imports))


def test_every_module_has_a_layer(graph):
    mods, _, _ = graph
    _fail("modules in no layer", unplaced_modules(mods))


def test_no_import_from_a_higher_layer(graph):
    _, imports, _ = graph
    _fail("imports from a higher layer", layer_violations(imports))


def test_no_function_level_import_but_optional_extras(graph):
    _, imports, _ = graph
    _fail("imports inside functions", function_level_violations(imports))


def test_lazy_import_exceptions_are_still_needed(graph):
    """Every LAZY_IMPORTS entry names a function-level import that exists (no stale exemption)."""
    _, imports, _ = graph
    present = {(i.importer, i.target) for i in imports if i.in_function}
    assert set(LAZY_IMPORTS) <= present, sorted(set(LAZY_IMPORTS) - present)


def test_no_module_reads_another_packages_privates(graph):
    mods, imports, reads = graph
    _fail("private names used outside their package", private_violations(mods, imports, reads))


# ----------------------------------------------------------------------------- the checks, checked

def _write_package(root: Path, files: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


TOY_LAYERS = (("refbayes._low", "refbayes"), ("refbayes.mid",), ("refbayes.top",))


def test_a_circle_is_reported_as_a_path_with_lines(tmp_path):
    _write_package(tmp_path, {
        "refbayes/__init__.py": "",
        "refbayes/mid/__init__.py": "from refbayes.mid import a\n",
        "refbayes/mid/a.py": "import numpy\nfrom refbayes.mid.b import f\n",
        "refbayes/mid/b.py": "def f():\n    from refbayes.mid import c\n",
        "refbayes/mid/c.py": "from . import a\n",
    })
    _, imports, _ = read_graph(tmp_path)
    (message,) = find_cycles(imports)
    assert message.startswith("circle refbayes.mid.a -> refbayes.mid.b -> refbayes.mid.c -> "
                              "refbayes.mid.a ")
    assert "refbayes/mid/b.py:2: refbayes.mid.b -> refbayes.mid.c (in a function)" in message
    assert "refbayes/mid/c.py:1: refbayes.mid.c -> refbayes.mid.a" in message


def test_a_package_importing_its_submodules_is_no_circle(tmp_path):
    _write_package(tmp_path, {
        "refbayes/__init__.py": "",
        "refbayes/mid/__init__.py": "from refbayes.mid.a import x\n",
        "refbayes/mid/a.py": "from refbayes.mid import _b\nx = 1\n",
        "refbayes/mid/_b.py": "import refbayes\n",
    })
    _, imports, _ = read_graph(tmp_path)
    assert find_cycles(imports) == []


def test_a_higher_layer_import_is_reported(tmp_path):
    _write_package(tmp_path, {
        "refbayes/__init__.py": "from refbayes._low import f\n",
        "refbayes/_low.py": "def f():\n    import refbayes.top\n",
        "refbayes/mid/__init__.py": "from refbayes import _low\n",
        "refbayes/top.py": "from refbayes.mid import x\nimport refbayes\n",
    })
    mods, imports, _ = read_graph(tmp_path)
    assert unplaced_modules(mods, TOY_LAYERS) == []
    assert layer_violations(imports, TOY_LAYERS) == [
        "refbayes/_low.py:2: refbayes._low (layer 0, refbayes._low) imports refbayes.top "
        "(layer 2, refbayes.top), a higher layer"]
    assert layer_of("refbayes.elsewhere", TOY_LAYERS) is None  # "refbayes" covers __init__ only


def test_function_level_imports_but_extras_and_exceptions_are_reported(tmp_path):
    _write_package(tmp_path, {
        "refbayes/__init__.py": "import scipy\n",
        "refbayes/mid.py": ("def f():\n    import torch.nn\n    import scipy.io\n"
                            "    from refbayes import top\n"
                            "class C:\n    def g(self):\n        import numba\n"
                            "lam = lambda: __import__('os')\n"
                            "def k(name):\n    importlib.import_module(name)\n"),
        "refbayes/top.py": "",
    })
    _, imports, _ = read_graph(tmp_path)
    got = function_level_violations(imports, {"torch": "extra"},
                                    {("refbayes.mid", "numba"): "measured"})
    assert [m.split(" inside")[0] for m in got] == [
        "refbayes/mid.py:3: refbayes.mid imports scipy.io",
        "refbayes/mid.py:4: refbayes.mid imports refbayes.top",
        "refbayes/mid.py:8: refbayes.mid imports os"]


def test_privates_used_outside_their_package_are_reported(tmp_path):
    _write_package(tmp_path, {
        "refbayes/__init__.py": "from refbayes._low import f\n",
        "refbayes/_low.py": "def f():\n    pass\n_hidden = 1\n",
        "refbayes/one.py": "_x = 1\n",
        "refbayes/mid/__init__.py": "from refbayes.mid import _impl\n",
        "refbayes/mid/_impl.py": "from refbayes.mid.a import _y\n",
        "refbayes/mid/a.py": "_y = 2\n__all__ = []\n",
        "refbayes/top.py": ("from refbayes import _low, one\nfrom refbayes.mid._impl import g\n"
                            "from refbayes.mid.a import _y, __all__\nimport refbayes.mid.a as ma\n"
                            "def h():\n    return one._x + ma._y + _low.f() + _low._hidden\n"),
    })
    mods, imports, reads = read_graph(tmp_path)
    assert sorted(private_violations(mods, imports, reads)) == [
        "refbayes/top.py:2: refbayes.top imports refbayes.mid._impl.g: _impl is private to "
        "refbayes.mid",
        "refbayes/top.py:3: refbayes.top imports refbayes.mid.a._y: _y is private to refbayes.mid",
        "refbayes/top.py:6: refbayes.top reads refbayes._low._hidden: _hidden is private to "
        "refbayes._low",
        "refbayes/top.py:6: refbayes.top reads refbayes.mid.a._y: _y is private to refbayes.mid",
        "refbayes/top.py:6: refbayes.top reads refbayes.one._x: _x is private to refbayes.one",
    ]


# ----------------------------------------------------------------------------- `import refbayes`

SUBPACKAGES = ("linalg", "models", "methods", "datasets", "experiments", "tracing", "conformance",
               "conventions", "metrics", "layout", "cli", "verify")


def test_import_refbayes_imports_no_subpackage_and_says_to_import_them_explicitly():
    """`import refbayes` stays the lowest layer and cheap (issue 35, item 5): measured with
    `python -X importtime -c "import refbayes"`, about 60 ms, against about 420 ms with
    refbayes.methods (which pulls in linalg, models and SciPy) and 240 ms for `refbayes.cli`'s
    own start-up path, so the package does not import its subpackages. Its docstring says so,
    and `refbayes.methods` before `import refbayes.methods` is an AttributeError that says what
    to write."""
    import subprocess
    import sys
    code = ("import sys, refbayes\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('refbayes'))))\n"
            "try:\n    refbayes.methods\nexcept AttributeError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    loaded, message = done.stdout.splitlines()
    assert not {f"refbayes.{p}" for p in SUBPACKAGES} & set(loaded.split()), loaded
    assert message == ("module 'refbayes' has no attribute 'methods': its subpackages are "
                       "imported explicitly (`import refbayes.methods`)")
    import refbayes
    assert "imported explicitly" in refbayes.__doc__ and "import refbayes.methods" in \
        refbayes.__doc__
    with pytest.raises(AttributeError, match="no attribute 'nosuch'$"):
        refbayes.nosuch  # noqa: B018  (only subpackages get the hint)
    assert refbayes.unchecked is not None and refbayes.__version__
