"""Build hook: ship the derivation notes (derivations/*.md) inside the package.

Everything else is in pyproject.toml. The notes live at the top of the repository, where the docs
(docs/derivations.md) and the tests read them; refbayes' docstrings, messages and traces point to
them as ``derivations/NAME.md``. ``build_py`` copies them to ``refbayes/derivations/`` of the
build, so every install (``pip install .``, a wheel) has them at that same relative path next to
the code, and ``refbayes derivation NAME`` prints one (``refbayes.cli``). A build without the
notes (an sdist made without MANIFEST.in's ``graft derivations``) fails instead of shipping a
package whose pointers lead nowhere.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class build_py_with_notes(build_py):
    def run(self):
        super().run()
        notes = sorted((HERE / "derivations").glob("*.md"))
        if not notes:
            raise RuntimeError(f"no derivation notes under {HERE / 'derivations'}: the package "
                               "would point to notes it does not contain")
        target = Path(self.build_lib) / "refbayes" / "derivations"
        target.mkdir(parents=True, exist_ok=True)
        for note in notes:
            shutil.copyfile(note, target / note.name)


setup(cmdclass={"build_py": build_py_with_notes})
