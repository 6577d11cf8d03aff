"""Sphinx configuration of the refbayes documentation.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (the ``docs`` extra).
Generated at build time, git-ignored (docs/.gitignore): ``api/`` (one page per module of
API_MODULES), ``derivations/`` (one stub per note of ../derivations/, which it includes in place),
``labels.md`` (tools/label_index.py: every label, its code lines and its tests) and ``tutorials/`` (sphinx-gallery runs every script of ``tutorial_scripts/``).
"""
import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import importlib.util  # noqa: E402

import refbayes  # noqa: E402


def _load_label_index():
    """tools/label_index.py, loaded from its path (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("label_index", ROOT / "tools" / "label_index.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["label_index"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


# The label index page, generated from the notes', the code's and the tests' tags of this tree.
label_index = _load_label_index()
label_index.OUTPUT.write_text(label_index.render(label_index.build()), encoding="utf-8")

# The API pages: the one list to edit (a module here gets a page under api/).
API_MODULES = [
    "refbayes.methods.slang",
    "refbayes.methods.ngvi",
    "refbayes.methods.exact_vi",
    "refbayes.methods.vogn",
    "refbayes.methods.vogn_mpi",
    "refbayes.methods.vadam",
    "refbayes.methods.noisy_adam",
    "refbayes.methods.noise_gamma",
    "refbayes.methods.bbb",
    "refbayes.methods.adam",
    "refbayes.methods.mc_dropout",
    "refbayes.methods.noisy_kfac",
    "refbayes.methods.ktied",
    "refbayes.methods.swag",
    "refbayes.methods.laplace",
    "refbayes.methods.riemannian_laplace",
    "refbayes.methods.driver",
    "refbayes.methods.records",
    "refbayes.models",
    "refbayes.linalg",
    "refbayes.metrics",
    "refbayes.datasets",
    "refbayes.verify",
    "refbayes.layout",
    "refbayes.conventions",
    "refbayes.tracing",
    "refbayes.tracing.tracer",
    "refbayes.tracing.files",
    "refbayes.tracing.chain",
    "refbayes.tracing.problems",
    "refbayes.tracing.printing",
]

project = "refbayes"
copyright = "the refbayes authors"
release = version = refbayes.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
    "cli_reference",
    "csv_summary",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "tutorial_scripts/README.rst", "tutorials/*.ipynb",
                    "tutorials/*.py", "tutorials/*.zip", "tutorials/*.md5",
                    "tutorials/*.json", "sg_execution_times.rst"]
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "none"  # the numpydoc Parameters sections carry the types
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
numpydoc_xref_param_type = False

smartquotes = False  # code and primes (u'_j) stay as written
html_theme = "alabaster"
html_title = f"refbayes {release}"
html_static_path = []

sphinx_gallery_conf = {
    "examples_dirs": "tutorial_scripts",
    "gallery_dirs": "tutorials",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "abort_on_example_error": True,
    "plot_gallery": "True",
    "within_subsection_order": "FileNameSortKey",
    "reset_modules": ("matplotlib",),
    "show_memory": False,
}


def _write(path: Path, text: str) -> None:
    """Write only when changed, so an incremental build does not reread everything."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _owners() -> dict:
    """(module, name) -> the module whose page documents that object: a name several modules
    export (``Batch``, defined in a private module) is documented once, on the first page of
    API_MODULES that exports it, and listed only there."""
    import importlib

    first, owners = {}, {}
    for module in API_MODULES:
        mod = importlib.import_module(module)
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name, None)
            if obj is None or not (isinstance(obj, type) or callable(obj)):
                continue
            home = getattr(obj, "__module__", module) or module
            if home == module or home.startswith(module + "."):
                continue  # defined here (or below, for a package): its own page
            owners[(module, name)] = first.setdefault(id(obj), module)
    return owners


def _generate(app) -> None:
    api = DOCS / "api"
    owners = _owners()
    for old in api.glob("*.rst"):
        if old.stem not in API_MODULES:
            old.unlink()
    for name in API_MODULES:
        exclude = sorted(n for n, home in owners.items() if n[0] == name and home != name)
        option = f"   :exclude-members: {', '.join(n[1] for n in exclude)}\n" if exclude else ""
        _write(api / f"{name}.rst",
               f"{name}\n{'=' * len(name)}\n\n.. automodule:: {name}\n{option}")
    notes = DOCS / "derivations"
    stems = sorted(p.stem for p in (ROOT / "derivations").glob("*.md"))
    for old in notes.glob("*.md"):
        if old.stem not in stems:
            old.unlink()
    for stem in stems:
        # MyST's include: the note stays in derivations/, its text is parsed here
        _write(notes / f"{stem}.md", f"```{{include}} ../../derivations/{stem}.md\n```\n")


def setup(app):
    app.connect("builder-inited", _generate)
