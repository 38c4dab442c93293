"""Kernel launches that reuse the compiled kernel without Triton's per-call argument binding.

``kernel[grid](*args)`` binds and specialises every argument on each call (dtype, 16-byte alignment of pointers,
integer width and divisibility), hashes the result and looks the compiled kernel up. That is tens of microseconds
of Python per launch: at 8K tokens an attention forward+backward issues three launches and runs about 1 ms of
host code on an H200 host against about 1 ms of kernels, so the host sets the pace. :func:`launch` keys the
compiled kernel by a cheaper, stricter summary of the arguments and calls its launcher directly:

- tensors: dtype and whether ``data_ptr`` is 16-byte aligned (Triton's pointer specialisation);
- integers, floats, bools, strings (constexprs and launch options such as ``num_warps`` included) and tuples of
  them: their exact values (Triton specialises integers on ``== 1``, ``% 16 == 0`` and the width, and compiles
  constexprs in; the exact value implies all of it);
- TMA descriptors (``TensorDescriptor``): base dtype and alignment, shape, strides, block shape, layout, padding
  (:func:`descriptor_key`; precomputed by the descriptor's maker where it can, ``LAUNCH_KEY``);
- the kernel, the grid (a tuple) and the current device.

Any other argument (a reinterpreted tensor, ...) or a callable grid sends the launch through ``kernel[grid]``. The
keys hold no tensors. What the direct call skips (Triton's own launch does it): the ``pre_run_hooks`` of the
kernel, the check that globals it reads are unchanged, and Triton knobs changed after the first launch of a key
(``runtime.debug``, instrumentation): call :func:`clear` after changing them.

Equal keys therefore mean equal specialisations, and a key seen for the first time goes through
``kernel[grid](...)`` (compiling if Triton has no kernel yet), whose result is kept. Under ``TRITON_INTERPRET=1``
every call goes through ``kernel[grid]``. The direct call is the one ``JITFunction.run`` makes in Triton 3.6 to 3.9
(``CompiledKernel.run`` with the launch hooks of ``triton.knobs.runtime``).
"""

from __future__ import annotations

import torch
from triton import knobs
from triton.runtime.driver import driver

from .env import interpreting

_MAX_ENTRIES = 512  # distinct (kernel, shape) launches kept; a training run sees a handful of sequence lengths
_cache: dict = {}


class _Uncacheable(Exception):
    """An argument this module does not summarise: the launch goes through ``kernel[grid]``."""


def _arg_key(a):
    t = type(a)
    if t is torch.Tensor:  # the common case first: this runs for every argument of every launch
        return (a.dtype, a.data_ptr() % 16 == 0)
    if a is None or t is int or t is str:
        return a
    if t is bool:  # an i1 argument or a flag, never confused with the int 1
        return (bool, a)
    if t is float:  # exact: a constexpr float is compiled in (an fp32 argument would need only the type)
        return (float, a)
    if t is tuple:
        return (tuple, tuple(map(_arg_key, a)))
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    key = getattr(a, LAUNCH_KEY, None)  # a descriptor that carries its summary (gluon_bwd.tensor_desc)
    if key is not None:
        return key
    base = getattr(a, "base", None)
    if isinstance(base, torch.Tensor) and all(hasattr(a, f) for f in ("shape", "strides", "block_shape", "layout")):
        return descriptor_key(a)
    raise _Uncacheable(t.__name__)  # e.g. a reinterpreted tensor: Triton's own binder decides


LAUNCH_KEY = "flashmask_launch_key"  # attribute name of a descriptor's precomputed :func:`descriptor_key`


def descriptor_key(desc) -> tuple:
    """The key of a TMA descriptor (``TensorDescriptor``): base dtype and 16-byte alignment, shape, strides, block
    shape, layout, padding. A descriptor may carry it as the attribute ``LAUNCH_KEY`` when its maker guarantees
    it (the same geometry and an aligned base)."""
    return ("desc", desc.base.dtype, desc.base.data_ptr() % 16 == 0, tuple(desc.shape), tuple(desc.strides),
            tuple(desc.block_shape), desc.layout, getattr(desc, "padding", None))


def _device_and_stream() -> tuple:
    """The current device and its raw stream, where Triton launches (as ``JITFunction.run``); a compiled kernel's
    function handle belongs to one device, so the device is part of the key."""
    active = driver.active
    device = active.get_current_device()
    return device, active.get_current_stream(device)


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)`` for a ``@triton.jit`` / ``@gluon.jit`` kernel, where every parameter is
    passed (positionally, then constexprs by keyword in signature order or any order) and launch options such as
    ``num_warps`` are keywords; a 1-3 int ``grid``.

    Raises what ``kernel[grid]`` raises on the first launch of a key (compilation errors, ``OutOfResources``).
    """
    if interpreting() or type(grid) is not tuple:
        kernel[grid](*args, **kwargs)
        return
    device, stream = _device_and_stream()
    try:
        key = (id(kernel), device, grid, tuple(map(_arg_key, args)), tuple(kwargs), tuple(map(_arg_key, kwargs.values())))
        entry = _cache.get(key)
    except (_Uncacheable, TypeError):  # TypeError: an unhashable layout or constexpr
        key, entry = None, None
    if entry is not None and entry[0] is not kernel:  # the id of a kernel since freed
        entry = None
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        if key is not None and hasattr(compiled, "packed_metadata"):  # a compiled kernel, not a pending one
            if len(_cache) >= _MAX_ENTRIES:
                _cache.clear()
            tail = tuple(kernel.arg_names[len(args):])
            if all(nm in kwargs for nm in tail):
                _cache[key] = (kernel, compiled, tail)
        return
    _, compiled, tail = entry
    full = args + tuple(kwargs[nm] for nm in tail) if tail else args
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    meta = compiled.launch_metadata(grid, stream, *full) if enter is not None else None
    g = grid + (1, 1)
    compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full)


def clear() -> None:
    """Forget every kept kernel (tests; after changing Triton knobs that alter compilation or launches)."""
    _cache.clear()
