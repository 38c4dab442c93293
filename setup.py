"""Shim so that ``pip install -e .`` works with older pip; metadata lives in pyproject.toml."""

from setuptools import setup

setup(
    packages=[
        "flashmask",
        "flashmask.benchmarks",
        "flashmask.experimental",
    ]
    + __import__("setuptools").find_packages(include=["paddlenlp_ext", "paddlenlp_ext.*"]),
    package_dir={"flashmask": "ops/flashmask", "paddlenlp_ext": "paddlenlp_ext"},
)
