"""Load a repository script (``llm/*.py``, ``benchmarks/*.py``: scripts, not packages) as a module for the tests."""

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_script(relpath: str, name: str | None = None):
    """``ROOT/relpath`` executed as a fresh module ``name`` (default: the file's stem) and registered in
    ``sys.modules`` (dataclasses resolve string annotations through it)."""
    name = name or pathlib.Path(relpath).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
