"""Every CuPy name refbayes can reach on the CuPy path exists in CuPy 14.

The CuPy stand-in (``tests/standin``) and a real device only catch a missing name on the lines a
test happens to run; this reads the source instead. Each ``refbayes/**/*.py`` is parsed with
``ast`` and every attribute that CuPy must provide when the backend is CuPy is collected, with the
CuPy namespace it is looked up in:

- ``xp.NAME``, ``xp_of(...).NAME`` and names bound to ``xp_of(...)`` -> ``cupy``;
  ``xp.linalg.NAME`` -> ``cupy.linalg``, ``xp.random.NAME`` -> ``cupy.random``;
- ``linalg_of(...).NAME`` and names bound to ``linalg_of(...)`` (``sla = linalg_of(xp)`` then
  ``sla.NAME``; ``tri = linalg_of(xp).solve_triangular`` is a use of ``solve_triangular``)
  -> ``cupyx.scipy.linalg``;
- ``cupy.NAME`` / ``cupyx.NAME`` (and their submodules) after ``import cupy`` / ``import cupyx...``
  (any alias), and ``from cupy... import NAME``.

The name ``xp`` always means the backend namespace (the convention of ``refbayes.backend``); other
names only through such a binding in the same function or an enclosing scope (flow-insensitive).
NumPy-only code is skipped: the body of ``if xp is np:`` (or an ``and`` that contains it), the
``else`` of ``if xp is not np:`` (or an ``or`` that contains it), the same for ``a if .. else b``,
and the statements after a guard ``if xp is not np: ... return / raise`` in the same block (its
implicit else). Here ``xp`` stands for any expression that resolves to the backend namespace
(``xp_of(a) is not np`` too). No module is exempt: code that only ever sees NumPy writes ``np.``,
which is not collected, so a module needs no exemption to pass.

Each (namespace, name) is checked against ``tests/standin/cupy14_names.json``, CuPy 14.2's public
names (``dir()`` of each module). ``cupy.ndarray`` methods are not checked here (the stand-in
refuses the missing ones at run time); submodules the list does not pin (``cupy.fft``,
``cupy.cuda``, ...) are checked as names of their parent only.
"""
from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "refbayes"
PINNED = json.loads((ROOT / "tests" / "standin" / "cupy14_names.json").read_text())["names"]
# the module namespaces of the pinned list ("cupy.ndarray" holds methods, not module names)
NAMESPACES = frozenset(k for k in PINNED if k != "cupy.ndarray")

_XP_FUNCS = {"xp_of": "cupy", "get_xp": "cupy", "linalg_of": "cupyx.scipy.linalg"}
_TERMINAL = (ast.Return, ast.Raise, ast.Continue, ast.Break)


class _Scope:
    """Names bound to a CuPy namespace in one function (or module / class) body, and its parent."""

    def __init__(self, parent=None):
        self.parent, self.aliases = parent, {}

    def lookup(self, name):
        scope = self
        while scope is not None:
            if name in scope.aliases:
                return scope.aliases[name]
            scope = scope.parent
        return None


class _Scanner:
    """Collects (line, name, namespace) for the CuPy attribute uses of one module's AST."""

    def __init__(self):
        self.uses: list[tuple[int, str, str]] = []

    # --- what an expression is
    def ns_of(self, node, scope):
        """The CuPy namespace ``node`` evaluates to on the CuPy path, or None."""
        if isinstance(node, ast.Name):
            return scope.lookup(node.id) or ("cupy" if node.id == "xp" else None)
        if isinstance(node, ast.Call):
            f = node.func
            fname = (f.id if isinstance(f, ast.Name)
                     else f.attr if isinstance(f, ast.Attribute) else None)
            if fname == "get_xp" and node.args and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value == "numpy":
                return None
            return _XP_FUNCS.get(fname)
        if isinstance(node, ast.Attribute):
            base = self.ns_of(node.value, scope)
            if base is not None and f"{base}.{node.attr}" in NAMESPACES:
                return f"{base}.{node.attr}"
        return None

    def _is_backend(self, node, scope):
        return self.ns_of(node, scope) == "cupy"

    def _is_np(self, node):
        return isinstance(node, ast.Name) and node.id in ("np", "numpy")

    def _compare(self, test, scope, ops):
        """True for ``X op np`` / ``np op X`` with X the backend namespace, op in ops."""
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1
                and isinstance(test.ops[0], ops)):
            return False
        a, b = test.left, test.comparators[0]
        return (self._is_backend(a, scope) and self._is_np(b)) or \
            (self._is_np(a) and self._is_backend(b, scope))

    def body_is_numpy(self, test, scope):
        """``test`` true implies the backend is NumPy: ``xp is np``, or an ``and`` holding it."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return any(self.body_is_numpy(v, scope) for v in test.values)
        return self._compare(test, scope, (ast.Is, ast.Eq))

    def else_is_numpy(self, test, scope):
        """``test`` false implies the backend is NumPy: ``xp is not np``, or an ``or`` with it."""
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
            return any(self.else_is_numpy(v, scope) for v in test.values)
        return self._compare(test, scope, (ast.IsNot, ast.NotEq))

    # --- bindings
    def bind(self, body, scope):
        """Record the namespace aliases assigned or imported in ``body`` (not in nested defs)."""
        for _ in range(2):  # aliases of aliases (la = xp.linalg after xp = xp_of(a))
            for node in self._own_nodes(body):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        self._bind_target(target, node.value, scope)
                elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                    self._bind_target(node.target, node.value, scope)
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.name.split(".")[0] in ("cupy", "cupyx"):
                            if a.asname:
                                if a.name in NAMESPACES:
                                    scope.aliases[a.asname] = a.name
                            else:
                                scope.aliases[a.name.split(".")[0]] = a.name.split(".")[0]
                elif isinstance(node, ast.ImportFrom) and node.module in NAMESPACES:
                    for a in node.names:
                        sub = f"{node.module}.{a.name}"
                        if sub in NAMESPACES:
                            scope.aliases[a.asname or a.name] = sub

    def _bind_target(self, target, value, scope):
        if isinstance(target, ast.Name):
            ns = self.ns_of(value, scope)
            if ns is not None:
                scope.aliases[target.id] = ns
        elif (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List))
              and len(target.elts) == len(value.elts)):
            for t, v in zip(target.elts, value.elts):
                self._bind_target(t, v, scope)

    @staticmethod
    def _own_nodes(body):
        """The nodes of ``body``, not descending into nested functions, lambdas or classes."""
        stack = list(body)
        while stack:
            node = stack.pop()
            yield node
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                          ast.ClassDef)):
                    stack.append(child)

    # --- the walk
    def scan_module(self, tree):
        scope = _Scope()
        self.bind(tree.body, scope)
        self.block(tree.body, False, scope)

    def block(self, stmts, numpy_only, scope):
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                self.expr(stmt.test, numpy_only, scope)
                body_np = self.body_is_numpy(stmt.test, scope)
                else_np = self.else_is_numpy(stmt.test, scope)
                self.block(stmt.body, numpy_only or body_np, scope)
                self.block(stmt.orelse, numpy_only or else_np, scope)
                if else_np and not stmt.orelse and isinstance(stmt.body[-1], _TERMINAL):
                    numpy_only = True  # a guard: the rest of this block is its implicit else
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for d in stmt.decorator_list:
                    self.expr(d, numpy_only, scope)
                if isinstance(stmt, ast.ClassDef):
                    for b in stmt.bases + [k.value for k in stmt.keywords]:
                        self.expr(b, numpy_only, scope)
                else:
                    self.expr(stmt.args, numpy_only, scope)
                inner = _Scope(scope)
                self.bind(stmt.body, inner)
                self.block(stmt.body, numpy_only, inner)
            elif isinstance(stmt, ast.ImportFrom) and stmt.module in NAMESPACES:
                if not numpy_only:
                    self.uses += [(stmt.lineno, a.name, stmt.module) for a in stmt.names]
            else:
                self.generic(stmt, numpy_only, scope)

    def generic(self, node, numpy_only, scope):
        """Sub-blocks of a compound statement as blocks, everything else as expressions."""
        for _, value in ast.iter_fields(node):
            items = value if isinstance(value, list) else [value]
            if items and all(isinstance(v, ast.stmt) for v in items):
                self.block(items, numpy_only, scope)
                continue
            for v in items:
                if isinstance(v, (ast.excepthandler, ast.match_case)):
                    self.generic(v, numpy_only, scope)
                elif isinstance(v, ast.AST):
                    self.expr(v, numpy_only, scope)

    def expr(self, node, numpy_only, scope):
        if isinstance(node, ast.IfExp):
            self.expr(node.test, numpy_only, scope)
            self.expr(node.body, numpy_only or self.body_is_numpy(node.test, scope), scope)
            self.expr(node.orelse, numpy_only or self.else_is_numpy(node.test, scope), scope)
            return
        if isinstance(node, ast.Attribute) and not numpy_only:
            ns = self.ns_of(node.value, scope)
            if ns is not None:
                self.uses.append((node.lineno, node.attr, ns))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):  # not in expressions; kept for safety
                self.block([child], numpy_only, scope)
            else:
                self.expr(child, numpy_only, scope)


def scan_source(source: str) -> list[tuple[int, str, str]]:
    """(line, name, namespace) of each CuPy attribute use in ``source`` (see the module)."""
    scanner = _Scanner()
    scanner.scan_module(ast.parse(source))
    return sorted(scanner.uses)


def scan_package() -> list[tuple[str, int, str, str]]:
    """(path relative to the repository, line, name, namespace) over ``refbayes/**/*.py``."""
    uses = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        uses += [(rel, line, name, ns) for line, name, ns in scan_source(path.read_text())]
    return uses


def missing(uses):
    return [(f, line, name, ns) for f, line, name, ns in uses if name not in PINNED[ns]]


# ----------------------------------------------------------------------------------- the check

def test_every_cupy_name_refbayes_uses_exists_in_cupy14():
    bad = missing(scan_package())
    assert not bad, ("names refbayes uses on the CuPy path that CuPy 14.2 lacks "
                     "(file:line name namespace):\n"
                     + "\n".join(f"{f}:{line} {name} {ns}" for f, line, name, ns in bad))


# ------------------------------------------------------------ the scanner is not vacuous

def test_scanner_finds_known_uses_in_the_package():
    uses = scan_package()
    assert len(uses) > 200, f"only {len(uses)} CuPy uses found: is the scan reading the package?"
    found = {(f, name, ns) for f, _, name, ns in uses}
    for f, name, ns in [
        ("refbayes/backend.py", "solve_triangular", "cupyx.scipy.linalg"),  # linalg_of(xp).NAME
        ("refbayes/linalg/lowrank.py", "eigh", "cupy.linalg"),                      # xp.linalg.NAME
        ("refbayes/backend.py", "errstate", "cupyx"),                               # import cupyx
        ("refbayes/backend.py", "cholesky", "cupy.linalg"),
    ]:
        assert (f, name, ns) in found, f"the scanner missed {name} ({ns}) in {f}"
    assert {ns for _, _, _, ns in uses} >= {"cupy", "cupy.linalg", "cupyx", "cupyx.scipy",
                                            "cupyx.scipy.linalg"}


@pytest.mark.parametrize("source, expected", [
    # every form of use, each flagged
    ("linalg_of(xp).cho_solve(c, b)", {"cho_solve@cupyx.scipy.linalg"}),
    ("sla = linalg_of(xp)\nsla.cho_solve(c, b)", {"cho_solve@cupyx.scipy.linalg"}),
    ("tri = linalg_of(xp).cho_factor\ntri(a)", {"cho_factor@cupyx.scipy.linalg"}),
    ("xp.linalg.cho_solve(c, b)", {"linalg@cupy", "cho_solve@cupy.linalg"}),
    ("xp.random.default_gen()", {"random@cupy", "default_gen@cupy.random"}),
    ("xp_of(a).trapz2(a)", {"trapz2@cupy"}),
    ("xp, q = xp_of(a), 1\nxp.nope(a)", {"nope@cupy"}),
    ("b = xp_of(a)\nb.nope(a)", {"nope@cupy"}),
    ("la = xp_of(a).linalg\nla.nope(a)", {"linalg@cupy", "nope@cupy.linalg"}),
    ("import cupy as cp\ncp.nope(a)", {"nope@cupy"}),
    ("import cupyx\ncupyx.nope(a)", {"nope@cupyx"}),
    ("import cupyx.scipy.special\ncupyx.scipy.special.nope(a)",
     {"scipy@cupyx", "special@cupyx.scipy", "nope@cupyx.scipy.special"}),
    ("from cupyx.scipy import linalg as cla\ncla.cho_solve(a, b)",
     {"linalg@cupyx.scipy", "cho_solve@cupyx.scipy.linalg"}),
    ("from cupyx.scipy.linalg import cho_solve", {"cho_solve@cupyx.scipy.linalg"}),
    ("def f(a):\n    sla = linalg_of(xp_of(a))\n    def g():\n        return sla.cho_solve(a)\n",
     {"cho_solve@cupyx.scipy.linalg"}),
    # the CuPy branch of a backend test, or a test that does not decide the backend: flagged
    ("if xp is not np:\n    linalg_of(xp).cho_solve(c, b)", {"cho_solve@cupyx.scipy.linalg"}),
    ("if xp is np:\n    pass\nelse:\n    xp.nope(a)", {"nope@cupy"}),
    ("if xp is np or big:\n    xp.nope(a)", {"nope@cupy"}),
    ("if xp is not np and big:\n    pass\nelse:\n    xp.nope(a)", {"nope@cupy"}),
    ("if xp is np:\n    return 1\nxp.nope(a)", {"nope@cupy"}),
    ("if xp is not np:\n    f()\nxp.nope(a)", {"nope@cupy"}),
    ("y = xp.nope(a) if xp is not np else 0", {"nope@cupy"}),
    # NumPy-only code: not flagged
    ("if xp is np:\n    linalg_of(xp).cho_solve(c, b)", set()),
    ("if np is xp:\n    sla = linalg_of(xp)\n    sla.cho_solve(c, b)", set()),
    ("if xp is not np:\n    pass\nelse:\n    linalg_of(xp).cho_solve(c, b)", set()),
    ("if xp is np and n > 64:\n    linalg_of(xp).eigh(A, subset_by_index=[0, 1])", set()),
    ("if big or xp is not np:\n    pass\nelse:\n    xp.nope(a)", set()),
    ("if xp_of(a) is not np:\n    raise ValueError('numpy only')\nxp.nope(a)", set()),
    ("def f(xp):\n    if xp is not np:\n        return 0\n    xp.nope(a)\nxp.fine(a)",
     {"fine@cupy"}),
    ("y = linalg_of(xp).cho_solve(c, b) if xp is np else 0", set()),
    ("if xp is np:\n    import cupyx\n    from cupy import nope", set()),
    # NumPy itself is never collected
    ("np.linalg.cho_solve(c, b)\nscipy.linalg.cho_solve(c, b)", set()),
])
def test_scanner_on_snippets(source, expected):
    got = {f"{name}@{ns}" for _, name, ns in scan_source(textwrap.dedent(source))}
    assert got == expected, source


def test_missing_names_are_reported_with_file_and_line():
    uses = [("refbayes/x.py", 3, "cho_solve", "cupyx.scipy.linalg"),
            ("refbayes/x.py", 4, "solve_triangular", "cupyx.scipy.linalg"),
            ("refbayes/x.py", 5, "eigh", "cupy.linalg")]
    assert missing(uses) == [("refbayes/x.py", 3, "cho_solve", "cupyx.scipy.linalg")]
