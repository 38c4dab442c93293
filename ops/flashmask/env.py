"""The environment variables the FlashMask kernels read, all read here.

- ``FLASHMASK_FWD`` / ``FLASHMASK_BWD``: which kernel runs the forward / the backward where the Hopper Gluon
  kernel could (sm_90 GPU; forward head dims 64, 128, 256, backward 64, 128; :mod:`flashmask.dispatch`).

  - ``auto`` (default): the Gluon kernel on a Triton it was built for (``dispatch.SUPPORTED_TRITON``); if it
    fails, one warning and the Triton kernel for the rest of the process.
  - ``triton``: always the Triton kernels (the escape hatch; the backward's dQ is then bitwise reproducible).
  - ``gluon``: the Gluon kernel wherever its scope allows, on any Triton version; a failure raises (to try the
    Gluon kernels on a new Triton, or to make a GPU test fail loudly).

- ``TRITON_INTERPRET=1`` (Triton's own variable, set before triton is imported): the kernels run on CPU tensors
  in Triton's interpreter (fp32 / fp16; the CPU tests use it).

Read on every call (an environment lookup), so a test or benchmark can switch between calls.
"""

from __future__ import annotations

import os

KERNEL_CHOICES = ("auto", "triton", "gluon")


def kernel_choice(which: str) -> str:
    """The value of ``FLASHMASK_FWD`` (``which="fwd"``) or ``FLASHMASK_BWD`` (``"bwd"``), ``"auto"`` when unset.

    Raises:
        ValueError: a value outside ``KERNEL_CHOICES``, naming the variable.
    """
    name = f"FLASHMASK_{which.upper()}"
    val = os.environ.get(name, "auto")
    if val not in KERNEL_CHOICES:
        raise ValueError(f"{name}={val!r} is not one of {KERNEL_CHOICES} (ops/flashmask/README.md); unset it for "
                         "the default 'auto'")
    return val


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (Triton's CPU interpreter)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"
