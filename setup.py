"""Package layout (metadata lives in pyproject.toml): ``flashmask`` from ``ops/flashmask`` and ``paddlenlp_ext``."""

from setuptools import find_packages, setup

setup(
    packages=["flashmask"]
    + [f"flashmask.{p}" for p in find_packages(where="ops/flashmask")]
    + find_packages(include=["paddlenlp_ext", "paddlenlp_ext.*"]),
    package_dir={"flashmask": "ops/flashmask", "paddlenlp_ext": "paddlenlp_ext"},
)
