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
(``CompiledKernel.run`` with the launch hooks of ``triton.knobs.runtime``); the launch metadata that only launch
hooks read is built only while a hook is registered.

On Triton 3.6 with no launch hook registered, a kept kernel is launched one level lower, through the compiled C
launcher that ``CompiledKernel.run`` wraps (:func:`_raw_launcher`): tensors go in as their ``data_ptr()`` (the
launcher then skips its per-pointer ``cuPointerGetAttribute`` check; the key holds their dtype and whether they
are CUDA tensors, and the raw launch is kept only for a kernel whose tensors were CUDA tensors when Triton
launched it), and each TMA descriptor as the ``CUtensorMap`` Triton would
encode for it, kept per kept kernel, argument position and base address (the geometry is part of the key, so the
address determines the map). On an H200 host that took the four launches of a forward+backward from about 0.37 to
0.24 ms of host time (docs/kernel_notes.md). A kernel with global or profile scratch memory, or a launcher of
another layout, keeps the ``CompiledKernel.run`` call.
"""

from __future__ import annotations

import re
import types

import torch
import triton
from triton import knobs
from triton.runtime.driver import driver

from .env import interpreting

_MAX_ENTRIES = 512  # distinct (kernel, shape) launches kept; a training run sees a handful of sequence lengths
_MAX_TMA_MAPS = 1024  # encoded descriptors kept per kept kernel (position x base address: 9 per layer and step)
_cache: dict = {}

# Triton 3.6's launcher layout (backends/nvidia/driver.py: CudaLauncher, wrap_handle_tensordesc), the one the raw
# launch below follows; any other release keeps the CompiledKernel.run call.
_RAW_LAYOUT = tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2]) == (3, 6)
if _RAW_LAYOUT:
    try:
        from triton.backends.nvidia import driver as _nvidia_driver
        from triton.backends.nvidia.driver import make_tensordesc_arg
    except ImportError:  # a build without the NVIDIA backend
        _RAW_LAYOUT = False
    else:  # the C launcher's leading arguments: grid, stream, function, flags, scratch, metadata, hooks
        _RAW_LAYOUT = getattr(_nvidia_driver, "_BASE_ARGS_FORMAT", None) == "iiiKKppOOOOOO"
_HOOK_CHAIN = getattr(knobs, "HookChain", None)


class _Uncacheable(Exception):
    """An argument this module does not summarise: the launch goes through ``kernel[grid]``."""


def _arg_key(a):
    t = type(a)
    if t is torch.Tensor:  # the common case first: this runs for every argument of every launch
        return (a.dtype, a.data_ptr() % 16 == 0, a.is_cuda)
    if a is None or t is int or t is str:
        return a
    if t is bool:  # an i1 argument or a flag, never confused with the int 1
        return (bool, a)
    if t is float:  # exact: a constexpr float is compiled in (an fp32 argument would need only the type)
        return (float, a)
    if t is tuple:
        return (tuple, tuple(map(_arg_key, a)))
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0, a.is_cuda)
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


def _hooks_idle(enter, leave) -> bool:
    """No launch hook is registered: each is None or an empty ``HookChain`` (Triton 3.6's default)."""
    return ((enter is None or (type(enter) is _HOOK_CHAIN and not enter.calls))
            and (leave is None or (type(leave) is _HOOK_CHAIN and not leave.calls)))


class _Entry:
    """A kept kernel: the compiled kernel, the names of the keyword parameters in signature order, and its raw
    launch (:func:`_raw_launcher`; None where only ``CompiledKernel.run`` is known) with the encoded descriptors."""

    __slots__ = ("kernel", "compiled", "tail", "raw", "flags", "pointers", "descs", "maps")

    def __init__(self, kernel, compiled, tail, full):
        self.kernel, self.compiled, self.tail = kernel, compiled, tail
        self.raw, self.flags, self.pointers, self.descs = _raw_launcher(compiled, full) or (None, (), (), ())
        self.maps: dict = {}  # (position, base address) -> the descriptor's launcher arguments


def _is_c_function(f) -> bool:
    """Whether ``f`` is a function of a compiled extension module (the launcher Triton builds per signature)."""
    return isinstance(f, types.BuiltinFunctionType)


def _raw_launcher(compiled, full: tuple):
    """``(c_launch, (cooperative, pdl), tensor positions, ((descriptor position, its metadata), ...))`` for a
    compiled kernel of Triton 3.6 launched with the arguments ``full``, or None: another release, a kernel with
    scratch memory, a launcher of another layout, a descriptor without a tensor base or without metadata.

    ``c_launch`` is the compiled C function ``CudaLauncher.__call__`` ends in, found as ``CudaLauncher.launch``
    itself or as the ``launcher`` that ``wrap_handle_tensordesc`` closes over."""
    if not _RAW_LAYOUT:
        return None
    run = getattr(compiled, "run", None)
    if getattr(run, "global_scratch_size", None) != 0 or getattr(run, "profile_scratch_size", None) != 0:
        return None
    fn = getattr(run, "launch", None)
    if _is_c_function(fn):  # no descriptor arguments
        c_launch, descs = fn, ()
    else:
        code = getattr(fn, "__code__", None)
        if code is None:
            return None
        cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        c_launch, at, metas = cells.get("launcher"), cells.get("tensordesc_indices"), cells.get("tensordesc_meta")
        if not isinstance(at, (set, frozenset)) or not isinstance(metas, (list, tuple)) or len(at) != len(metas):
            return None
        descs = tuple(zip(sorted(at), metas))
        if any(not isinstance(m, dict) or i >= len(full) or not isinstance(getattr(full[i], "base", None), torch.Tensor)
               for i, m in descs):
            return None
    if not _is_c_function(c_launch):
        return None
    pointers = tuple(i for i, a in enumerate(full) if isinstance(a, torch.Tensor))
    if not all(full[i].is_cuda for i in pointers):  # Triton checks other tensors (pinned host memory): keep that
        return None
    flags = (getattr(run, "launch_cooperative_grid", None), getattr(run, "launch_pdl", None))
    if None in flags:
        return None
    return c_launch, flags, pointers, descs


def _launch_raw(entry: _Entry, g: tuple, stream, full: tuple) -> None:
    """``entry``'s kernel through its C launcher: tensors as addresses, descriptors as their encoded maps (encoded
    by Triton's own ``make_tensordesc_arg`` the first time a position sees a base address)."""
    out = list(full)
    for i in entry.pointers:
        out[i] = out[i].data_ptr()
    maps = entry.maps
    for i, meta in reversed(entry.descs):  # from the end: splicing a descriptor's fields keeps earlier positions
        desc = out[i]
        mk = (i, desc.base.data_ptr())
        fields = maps.get(mk)
        if fields is None:
            if len(maps) >= _MAX_TMA_MAPS:
                maps.clear()
            fields = maps[mk] = make_tensordesc_arg(desc, meta)
        out[i:i + 1] = fields
    compiled = entry.compiled
    entry.raw(g[0], g[1], g[2], stream, compiled.function, *entry.flags, None, None, compiled.packed_metadata, None,
              None, None, *out)


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
    if entry is not None and entry.kernel is not kernel:  # the id of a kernel since freed
        entry = None
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        if key is not None and hasattr(compiled, "packed_metadata"):  # a compiled kernel, not a pending one
            if len(_cache) >= _MAX_ENTRIES:
                _cache.clear()
            tail = tuple(kernel.arg_names[len(args):])
            if all(nm in kwargs for nm in tail):
                _cache[key] = _Entry(kernel, compiled, tail, args + tuple(kwargs[nm] for nm in tail))
        return
    tail = entry.tail
    full = args + tuple(kwargs[nm] for nm in tail) if tail else args
    enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
    g = grid + (1, 1)
    if _hooks_idle(enter, leave):
        if entry.raw is not None:
            _launch_raw(entry, g, stream, full)
            return
        meta = None  # read by launch hooks only
    else:
        meta = entry.compiled.launch_metadata(grid, stream, *full)
    compiled = entry.compiled
    compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, meta, enter, leave, *full)


def clear() -> None:
    """Forget every kept kernel (tests; after changing Triton knobs that alter compilation or launches)."""
    _cache.clear()
