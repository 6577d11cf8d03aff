"""Import a script of tools/ as a module for its tests (tools/ is not a package)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(filename: str, name: str | None = None):
    """tools/<filename> as module ``name`` (default the file's stem), registered in
    sys.modules first (dataclasses and pickling look a class's module up there)."""
    name = name or Path(filename).stem
    spec = importlib.util.spec_from_file_location(name, TOOLS / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
