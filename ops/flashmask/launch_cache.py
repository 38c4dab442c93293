"""Kernel launches that reuse the compiled kernel without Triton's per-call argument binding.

``kernel[grid](*args)`` binds and specialises every argument on each call (dtype, 16-byte alignment of pointers,
integer width and divisibility), hashes the result and looks the compiled kernel up. That is tens of microseconds
of Python per launch: at 8K tokens an attention forward+backward issues three launches and runs about 1 ms of
host code on an H200 host against about 1 ms of kernels, so the host sets the pace. :func:`launch` keys the
compiled kernel by a cheaper, stricter summary of the arguments and calls its launcher directly:

- tensors: dtype and whether ``data_ptr`` is 16-byte aligned (Triton's pointer specialisation);
- integers, constexprs and launch options (``num_warps``, ...): their exact values (Triton specialises on
  ``== 1``, ``% 16 == 0`` and the width; the exact value implies all three);
- floats and bools: their type; ``None``: itself;
- TMA descriptors (``TensorDescriptor``): base dtype and alignment, shape, strides, block shape, layout;
- the kernel, the grid and the current device.

Equal keys therefore mean equal specialisations, and a key seen for the first time goes through
``kernel[grid](...)`` (compiling if Triton has no kernel yet), whose result is kept. Under ``TRITON_INTERPRET=1``
every call goes through ``kernel[grid]``. The direct call is the one ``JITFunction.run`` makes in Triton 3.6 to 3.9
(``CompiledKernel.run`` with the launch hooks of ``triton.knobs.runtime``).
"""

from __future__ import annotations

import torch

from .env import interpreting

_MAX_ENTRIES = 512  # distinct (kernel, shape) launches kept; a training run sees a handful of sequence lengths
_cache: dict = {}


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if a is None or type(a) is int:
        return a
    if type(a) is bool:  # an i1 argument or a flag, never confused with the int 1
        return (bool, a)
    if isinstance(a, float):
        return float
    base = getattr(a, "base", None)
    if isinstance(base, torch.Tensor):  # a host TMA descriptor
        return (base.dtype, base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides), tuple(a.block_shape),
                getattr(a, "layout", None), getattr(a, "padding", None))
    return a  # constexpr values of other types (hashable by Triton's own rules)


def _device_and_stream() -> tuple:
    """The current device and its raw stream, where Triton launches (as ``JITFunction.run``); a compiled kernel's
    function handle belongs to one device, so the device is part of the key."""
    from triton.runtime.driver import driver

    active = driver.active
    device = active.get_current_device()
    return device, active.get_current_stream(device)


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` for a ``@triton.jit`` / ``@gluon.jit`` kernel, where every parameter is
    passed (positionally, then constexprs by keyword in signature order or any order) and launch options such as
    ``num_warps`` are keywords; a 1-3 int ``grid``.

    Raises what ``kernel[grid]`` raises on the first launch of a key (compilation errors, ``OutOfResources``).
    """
    if interpreting():
        kernel[grid](*args, **kwargs)
        return
    device, stream = _device_and_stream()
    try:
        key = (id(kernel), device, grid, tuple(map(_arg_key, args)), tuple((k, _arg_key(v)) for k, v in kwargs.items()))
        entry = _cache.get(key)
    except TypeError:  # an unhashable argument: Triton's own path decides
        key, entry = None, None
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        if key is not None and hasattr(compiled, "packed_metadata"):  # a compiled kernel, not a pending one
            if len(_cache) >= _MAX_ENTRIES:
                _cache.clear()
            tail = tuple(kernel.arg_names[len(args):])
            if all(nm in kwargs for nm in tail):
                _cache[key] = (compiled, tail)
        return
    compiled, tail = entry
    full = args + tuple(kwargs[nm] for nm in tail) if tail else args
    from triton import knobs

    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    meta = compiled.launch_metadata(grid, stream, *full) if enter is not None else None
    g = grid + (1, 1)
    compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full)


def clear() -> None:
    """Forget every kept kernel (tests; after changing Triton knobs that alter compilation)."""
    _cache.clear()
