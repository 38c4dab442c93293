"""Package layout (metadata lives in pyproject.toml): ``flashmask`` from ``ops/flashmask`` and ``paddlenlp_ext``.

Experimental kernels (any ``experimental`` subpackage) stay out of the wheel.
"""

from setuptools import find_packages, setup

EXCLUDE = ["experimental", "experimental.*", "*.experimental", "*.experimental.*"]

setup(
    packages=["flashmask"]
    + [f"flashmask.{p}" for p in find_packages(where="ops/flashmask", exclude=EXCLUDE)]
    + find_packages(include=["paddlenlp_ext", "paddlenlp_ext.*"], exclude=EXCLUDE),
    package_dir={"flashmask": "ops/flashmask", "paddlenlp_ext": "paddlenlp_ext"},
)
