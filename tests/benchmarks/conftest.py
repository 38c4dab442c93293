"""The ``e2e`` fixture: ``benchmarks/e2e_train.py`` loaded as a module (it is a script, not a package)."""

import pathlib

import pytest

from tests._scripts import load_script


@pytest.fixture(scope="module")
def e2e(request):
    """A fresh load per test module, so one module's monkeypatching cannot leak into another's."""
    name = f"e2e_train_{pathlib.Path(request.module.__file__).stem}"
    return load_script("benchmarks/e2e_train.py", name)
