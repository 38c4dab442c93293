"""The ``e2e`` fixture: ``benchmarks/e2e_train.py`` loaded as a module (it is a script, not a package)."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def e2e(request):
    """A fresh load per test module, so one module's monkeypatching cannot leak into another's."""
    name = f"e2e_train_{pathlib.Path(request.module.__file__).stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "e2e_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
