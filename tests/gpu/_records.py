"""Measured numbers of the GPU tests: printed, and appended as JSON lines to ``$GPU_RESULTS_JSON`` when set."""

from __future__ import annotations

import json
import os


def record(name: str, **values) -> None:
    """Print ``{"test": name, **values}`` as one JSON line; append it to ``$GPU_RESULTS_JSON`` when set."""
    line = json.dumps({"test": name, **values}, default=float)
    print(line)
    path = os.environ.get("GPU_RESULTS_JSON")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
