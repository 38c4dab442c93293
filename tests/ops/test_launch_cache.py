"""``launch_cache.launch``: the first launch of a specialisation goes through ``kernel[grid]``; later ones call the
kept compiled kernel with every parameter in signature order; anything Triton specialises on changes the key."""

import pytest
import torch

from flashmask import launch_cache


class _Compiled:
    packed_metadata = object()
    function = 7

    def __init__(self):
        self.runs = []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *args):
        self.runs.append(((g0, g1, g2), args))


class _Kernel:
    """Stands in for a ``JITFunction`` of ``(X, n, scale, BLOCK: constexpr, FLAG: constexpr)``."""
    arg_names = ["X", "n", "scale", "BLOCK", "FLAG"]

    def __init__(self):
        self.slow = []
        self.compiled = _Compiled()

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            self.slow.append((grid, args, kwargs))
            return self.compiled
        return call


@pytest.fixture(autouse=True)
def _fresh():
    launch_cache.clear()
    yield
    launch_cache.clear()


def _direct_launches_on_gpu_only(monkeypatch):
    """As on a GPU: compiled kernels (the suite sets TRITON_INTERPRET=1 on CPU machines), device 0."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(launch_cache, "_device_and_stream", lambda: (0, 0))


def test_second_launch_calls_the_compiled_kernel_with_constexprs_in_signature_order(monkeypatch):
    _direct_launches_on_gpu_only(monkeypatch)
    k, x, y = _Kernel(), torch.zeros(64), torch.ones(64)
    launch_cache.launch(k, (3,), x, 32, 0.5, FLAG=True, BLOCK=64, num_warps=4)
    launch_cache.launch(k, (3,), y, 32, 0.5, FLAG=True, BLOCK=64, num_warps=4)
    assert len(k.slow) == 1
    assert k.compiled.runs == [((3, 1, 1), (y, 32, 0.5, 64, True))]


class _Desc:
    """The fields of a host TMA descriptor that the key reads."""

    def __init__(self, base, block):
        self.base, self.shape, self.strides, self.block_shape = base, [4, 16], [16, 1], block
        self.layout, self.padding = ("nvmma", 128), "zero"


@pytest.mark.parametrize("change", ["int value", "constexpr", "float constexpr", "option", "grid", "dtype",
                                    "alignment", "bool for 1", "descriptor block"])
def test_a_changed_specialisation_goes_through_triton(monkeypatch, change):
    _direct_launches_on_gpu_only(monkeypatch)
    k, x = _Kernel(), torch.zeros(64)
    args, kw, grid = [x, 32, 0.5], dict(BLOCK=64, FLAG=0.5 if change == "float constexpr" else True, num_warps=4), (3,)
    if change == "descriptor block":
        args[0] = _Desc(x, [2, 16])
    launch_cache.launch(k, grid, *args, **kw)
    if change == "descriptor block":
        args[0] = _Desc(torch.ones(64), [4, 16])
    elif change == "float constexpr":
        kw["FLAG"] = 0.25  # FLAG = 0.5 first: a value compiled into the kernel
    elif change == "int value":
        args[1] = 48
    elif change == "constexpr":
        kw["BLOCK"] = 128
    elif change == "option":
        kw["num_warps"] = 8
    elif change == "grid":
        grid = (4,)
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    elif change == "alignment":
        args[0] = torch.zeros(65)[1:]  # 4 bytes past a 16-byte boundary
    else:
        args[1], k0 = 1, _Kernel()
        launch_cache.launch(k0, grid, x, 1, 0.5, **kw)
        launch_cache.launch(k0, grid, x, True, 0.5, **kw)
        assert len(k0.slow) == 2
        return
    launch_cache.launch(k, grid, *args, **kw)
    assert len(k.slow) == 2 and k.compiled.runs == []


def test_a_missing_constexpr_keyword_is_never_kept(monkeypatch):
    """A parameter left to its default cannot be placed in the direct call: every launch goes through Triton."""
    _direct_launches_on_gpu_only(monkeypatch)
    k, x = _Kernel(), torch.zeros(64)
    for _ in range(2):
        launch_cache.launch(k, (1,), x, 32, 0.5, BLOCK=64)
    assert len(k.slow) == 2


def test_the_same_descriptor_geometry_over_another_tensor_is_kept(monkeypatch):
    _direct_launches_on_gpu_only(monkeypatch)
    k = _Kernel()
    for base in (torch.zeros(64), torch.ones(64)):
        launch_cache.launch(k, (1,), _Desc(base, [4, 16]), 32, 0.5, BLOCK=64, FLAG=False)
    assert len(k.slow) == 1 and k.compiled.runs[0][1][0].base[0] == 1


def test_a_descriptor_carrying_its_key_is_keyed_by_it(monkeypatch):
    """A descriptor whose maker attached ``LAUNCH_KEY`` is keyed by that value, the same as the computed key."""
    _direct_launches_on_gpu_only(monkeypatch)
    k, plain, carried = _Kernel(), _Desc(torch.zeros(64), [4, 16]), _Desc(torch.ones(64), [4, 16])
    setattr(carried, launch_cache.LAUNCH_KEY, launch_cache.descriptor_key(carried))
    for d in (plain, carried):
        launch_cache.launch(k, (1,), d, 32, 0.5, BLOCK=64, FLAG=False)
    assert len(k.slow) == 1 and k.compiled.runs[0][1][0] is carried


def test_unknown_arguments_and_callable_grids_go_through_triton(monkeypatch):
    """A reinterpreted tensor (a wrapper with a tensor ``base`` and no descriptor fields) and a grid function are
    left to Triton's binder, every time; nothing of theirs is kept."""
    _direct_launches_on_gpu_only(monkeypatch)

    class _Reinterpreted:
        def __init__(self, base):
            self.base, self.dtype = base, "fp8e4nv"

    k, x = _Kernel(), torch.zeros(64)
    for _ in range(2):
        launch_cache.launch(k, (1,), _Reinterpreted(x), 32, 0.5, BLOCK=64, FLAG=False)
        launch_cache.launch(k, lambda meta: (1,), x, 32, 0.5, BLOCK=64, FLAG=False)
    assert len(k.slow) == 4 and k.compiled.runs == [] and not launch_cache._cache


def test_a_new_kernel_at_a_freed_kernels_id_goes_through_triton(monkeypatch):
    _direct_launches_on_gpu_only(monkeypatch)
    old, new, x = _Kernel(), _Kernel(), torch.zeros(64)
    launch_cache.launch(old, (1,), x, 32, 0.5, BLOCK=64, FLAG=False)
    monkeypatch.setattr(launch_cache, "id", lambda obj: 7, raising=False)  # both kernels at one address
    launch_cache._cache = {(7,) + key[1:]: entry for key, entry in launch_cache._cache.items()}
    launch_cache.launch(new, (1,), x, 32, 0.5, BLOCK=64, FLAG=False)
    assert len(new.slow) == 1 and old.compiled.runs == []


def test_another_device_goes_through_triton(monkeypatch):
    """A compiled kernel's function handle belongs to the device it was loaded on."""
    _direct_launches_on_gpu_only(monkeypatch)
    k, x = _Kernel(), torch.zeros(64)
    for device in (0, 1):
        monkeypatch.setattr(launch_cache, "_device_and_stream", lambda d=device: (d, 0))
        launch_cache.launch(k, (1,), x, 32, 0.5, BLOCK=64, FLAG=False)
    assert len(k.slow) == 2 and k.compiled.runs == []


def test_the_interpreter_is_called_every_time(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    k, x = _Kernel(), torch.zeros(64)
    for _ in range(2):
        launch_cache.launch(k, (1,), x, 32, 0.5, BLOCK=64, FLAG=False)
    assert len(k.slow) == 2 and k.compiled.runs == []


def test_stage_retry_on_shared_memory_remembers_the_count_that_fits(monkeypatch):
    """``launch_config.launch``: a tile whose pipeline does not fit in shared memory is retried with fewer stages
    (a warning per retry), and later launches of the same kernel and constexprs start from the count that fit."""
    import triton

    from flashmask import launch_config

    calls = []

    def fake_launch(kernel, grid, *args, **kwargs):
        calls.append(kwargs["num_stages"])
        if kwargs["num_stages"] > 1:
            raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")

    def kernel():
        pass

    kernel.fn = kernel  # the warning names kernel.fn.__name__, as a JITFunction's
    monkeypatch.setattr(launch_config.launch_cache, "launch", fake_launch)
    monkeypatch.setattr(launch_config, "_WORKING_STAGES", {})
    with pytest.warns(RuntimeWarning) as record:
        launch_config.launch(kernel, (1,), 7, D=64, num_stages=3)
    assert [str(w.message).split(": ", 1)[1] for w in record] == [
        "out of shared memory with num_stages=3, retrying with num_stages=2",
        "out of shared memory with num_stages=2, retrying with num_stages=1"]
    assert calls == [3, 2, 1]
    launch_config.launch(kernel, (1,), 7, D=64, num_stages=3)
    assert calls == [3, 2, 1, 1]  # remembered: no failed attempt
    launch_config.launch(kernel, (1,), 7, D=128, num_stages=1)  # other constexprs: as asked
    assert calls == [3, 2, 1, 1, 1]

    def never_fits(kernel, grid, *args, **kwargs):
        raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")

    monkeypatch.setattr(launch_config.launch_cache, "launch", never_fits)
    with pytest.raises(triton.runtime.errors.OutOfResources):
        launch_config.launch(kernel, (1,), 7, D=256, num_stages=1)


class _CLauncher:
    """Stands in for Triton 3.6's compiled C launch function (``_raw_layout`` makes it pass as one)."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)


def _wrap_handle_tensordesc(launcher, tensordesc_indices, tensordesc_meta):
    """The shape of Triton 3.6's ``wrap_handle_tensordesc``: a closure over the C launcher."""
    def inner(*args):
        return launcher, tensordesc_indices, tensordesc_meta
    return inner


class _Run:
    """Triton 3.6's ``CudaLauncher``: ``launch`` and the fields of a kernel without scratch memory."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = False, True

    def __init__(self, launch):
        self.launch, self.calls = launch, []

    def __call__(self, *args):
        self.calls.append(args)


class _RawKernel(_Kernel):
    """A kernel compiled by Triton 3.6 with TMA descriptors at the positions ``descs`` (their metadata: a swizzle
    number each) and a C launcher; no descriptors: ``run.launch`` is the C launcher itself."""

    def __init__(self, arg_names, descs=(), scratch=0):
        super().__init__()
        self.arg_names = arg_names
        self.c_launch = _CLauncher()
        launch = (_wrap_handle_tensordesc(self.c_launch, set(descs), [{"swizzle": 3 + i} for i in range(len(descs))])
                  if descs else self.c_launch)
        self.compiled.run = _Run(launch)
        self.compiled.run.global_scratch_size = scratch


class _Cuda(torch.Tensor):
    """A CPU tensor that reports itself on CUDA (the raw launch is kept for kernels of CUDA tensors only)."""
    is_cuda = True


def _cuda(t):
    return t.as_subclass(_Cuda)


def _raw_layout(monkeypatch) -> list:
    """Triton 3.6's launcher layout, with ``_CLauncher`` as its C function and a recording stand-in for its
    descriptor encoder."""
    encoded = []

    def encode(desc, meta):
        encoded.append(desc.base.data_ptr())
        return ["map", meta["swizzle"], desc.base.data_ptr(), *desc.shape, *desc.strides]

    monkeypatch.setattr(launch_cache, "_RAW_LAYOUT", True)
    monkeypatch.setattr(launch_cache, "make_tensordesc_arg", encode, raising=False)
    monkeypatch.setattr(launch_cache, "_is_c_function", lambda f: isinstance(f, _CLauncher))
    return encoded


def _head(kernel, grid):
    """The 13 leading arguments of Triton 3.6's C launcher (``_BASE_ARGS_FORMAT``) for ``kernel`` at ``grid``."""
    return (*grid, 0, 7, False, True, None, None, kernel.compiled.packed_metadata, None, None, None)


def test_kept_kernels_launch_through_the_c_launcher_with_addresses_and_encoded_descriptors(monkeypatch):
    """With no launch hook, a kept kernel goes to the compiled C launcher: tensors as ``data_ptr()``, each
    descriptor spliced in place as its encoded fields, encoded once per position and base address."""
    _direct_launches_on_gpu_only(monkeypatch)
    encoded = _raw_layout(monkeypatch)
    k = _RawKernel(["D0", "X", "D2", "n", "BLOCK"], descs=(0, 2))
    a, b, x = _cuda(torch.zeros(64)), _cuda(torch.ones(64)), _cuda(torch.zeros(16))
    for first, second in ((a, b), (a, b), (b, b), (a, b)):
        launch_cache.launch(k, (3, 2), _Desc(first, [4, 16]), x, _Desc(second, [4, 16]), 32, BLOCK=64)
    assert len(k.slow) == 1 and k.compiled.runs == [] and k.compiled.run.calls == []
    pa, pb = a.data_ptr(), b.data_ptr()
    assert encoded == [pb, pa, pb]  # the first launch is Triton's own; then (2, b), (0, a), (0, b)

    def expanded(swizzle, p):
        return ("map", swizzle, p, 4, 16, 16, 1)

    assert k.c_launch.calls == [_head(k, (3, 2, 1)) + expanded(3, p0) + (x.data_ptr(),) + expanded(4, pb) + (32, 64)
                                for p0 in (pa, pb, pa)]


def test_a_kernel_without_descriptors_launches_through_its_c_launcher(monkeypatch):
    _direct_launches_on_gpu_only(monkeypatch)
    _raw_layout(monkeypatch)
    k, x, y = _RawKernel(["X", "Y", "n", "scale", "BLOCK"]), _cuda(torch.zeros(16)), _cuda(torch.ones(16))
    for _ in range(2):
        launch_cache.launch(k, (5,), x, y, 32, 0.5, BLOCK=64)
    assert k.c_launch.calls == [_head(k, (5, 1, 1)) + (x.data_ptr(), y.data_ptr(), 32, 0.5, 64)]


def test_a_registered_launch_hook_gets_triton_launch_with_its_metadata(monkeypatch):
    """A profiler's launch hook (proton adds one to the chain) sees every launch: then the kept kernel runs through
    ``CompiledKernel.run`` with the launch metadata and the hooks."""
    _direct_launches_on_gpu_only(monkeypatch)
    _raw_layout(monkeypatch)
    from triton import knobs

    seen, chain = [], knobs.HookChain()
    chain.add(seen.append)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", chain)
    k, x = _RawKernel(["D0", "X", "n", "BLOCK"], descs=(0,)), _cuda(torch.zeros(16))
    for _ in range(2):
        launch_cache.launch(k, (1,), _Desc(_cuda(torch.zeros(64)), [4, 16]), x, 32, BLOCK=64)
    assert k.c_launch.calls == [] and len(k.compiled.run.calls) == 1
    assert k.compiled.run.calls[0][7] is chain  # the enter hook, which the launcher calls


@pytest.mark.parametrize("why", ["scratch memory", "a host tensor", "descriptor without metadata"])
def test_kernels_outside_the_raw_layout_keep_the_compiled_kernel_call(monkeypatch, why):
    """Scratch memory, a tensor Triton accepted off the GPU (pinned host memory) or a descriptor Triton decomposes
    without metadata: the kept kernel runs through ``CompiledKernel.run``."""
    _direct_launches_on_gpu_only(monkeypatch)
    _raw_layout(monkeypatch)
    k = _RawKernel(["D0", "X", "n", "BLOCK"], descs=(0,), scratch=128 if why == "scratch memory" else 0)
    if why == "descriptor without metadata":
        k.compiled.run.launch = _wrap_handle_tensordesc(k.c_launch, {0}, [None])
    x = torch.zeros(16) if why == "a host tensor" else _cuda(torch.zeros(16))
    for _ in range(2):
        launch_cache.launch(k, (1,), _Desc(_cuda(torch.zeros(64)), [4, 16]), x, 32, BLOCK=64)
    assert k.c_launch.calls == [] and len(k.compiled.run.calls) == 1
