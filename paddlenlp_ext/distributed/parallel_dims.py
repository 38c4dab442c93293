"""The parallel layout: one object that validates the degrees once and owns the named ``DeviceMesh``.

Source: PaddleNLP ``TrainingArguments._post_init_parallel_degree`` (paddlenlp/trainer/training_args.py) for
how the degrees are resolved; torchtitan ``ParallelDims`` (torchtitan/distributed/parallel_dims.py) for the
shape of the object.

Mesh axes (outer to inner, so TP ranks are adjacent like Paddle's hybrid topology):

- ``"dp"``: plain data parallel (replicas; gradients all-reduced). PaddleNLP's ``data_parallel_degree``.
- ``"sharding"``: FSDP2 shard axis. PaddleNLP's ``sharding_parallel_degree``.
- ``"tp"``: tensor parallel. PaddleNLP's ``tensor_parallel_degree``.

``"batch"`` is the flattened ``dp x sharding`` axis: ranks on it read different data and sum their token
counts. Ranks that differ only in ``tp`` read the same data.

Degrees left at -1 (PaddleNLP's default) resolve as Paddle does: ``tp = 1``; when ``sharding`` is set the
sharding degree takes what TP leaves (``world / tp``), else it is 1; the data-parallel degree takes the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

_STAGES = ("stage1", "stage2", "stage3")


def parse_sharding(sharding: Any) -> tuple[str | None, bool]:
    """Parse PaddleNLP's ``sharding`` argument.

    Args:
        sharding: ``""``/``None``/``[]`` (off), ``"stage1"``, ``"stage2"``, ``"stage3"``, optionally followed
            by ``" offload"`` (e.g. ``"stage2 offload"``), or a list of those words (Paddle's parsed form).

    Returns:
        ``(stage or None, offload)``.

    Raises:
        ValueError: an unknown word, two stages, or ``offload`` without a stage (Paddle rejects that too).
    """
    if sharding is None:
        return None, False
    words = sharding.split() if isinstance(sharding, str) else [str(w) for w in sharding]
    stages = [w for w in words if w in _STAGES]
    unknown = [w for w in words if w not in _STAGES and w != "offload"]
    if unknown or len(stages) > 1:
        raise ValueError(
            f"training argument `sharding`={sharding!r}: expected one of {_STAGES}, optionally followed by "
            f"' offload' (e.g. \"stage2 offload\"); unknown or repeated words: {unknown or stages}"
        )
    offload = "offload" in words
    if offload and not stages:
        raise ValueError(f"training argument `sharding`={sharding!r}: 'offload' needs a stage, e.g. \"stage2 offload\"")
    return (stages[0] if stages else None), offload


@dataclass
class ParallelDims:
    """Validated parallel degrees plus the named mesh built from them.

    Args:
        dp: data-parallel (replica) degree, ``>= 1`` or -1 (resolve).
        sharding: FSDP shard degree, ``>= 1`` or -1 (resolve).
        tp: tensor-parallel degree, ``>= 1`` or -1 (means 1).
        world_size: number of processes.
        sharding_stage: ``"stage1"|"stage2"|"stage3"`` or None (PaddleNLP ``sharding``); decides
            ``reshard_after_forward`` (see ``docs/distributed.md``).
        offload: CPU offload of sharded parameters (PaddleNLP ``"stageN offload"``).
        sequence_parallel: TP sequence parallelism (norms and the residual stream sharded over the sequence).
        tensor_parallel_output: keep logits vocab-sharded and use a vocab-parallel cross entropy
            (``torch.distributed.tensor.parallel.loss_parallel``).
        tp_fp32_reduce: reduce the row-parallel partial sums (o/down projections) in fp32 when they are
            bf16/fp16 (twice the bytes of those collectives; see ``tp_styles``) and keep the fp32 sum (the
            residual stream is fp32 under autocast). None (default): on whenever ``tp > 1`` (at
            TP 2 on two H200s the bf16 sum drifts further from one GPU over 4 steps at the same speed within
            noise; ``docs/distributed.md``). False: bf16 sums, half the bytes.
        tp_impl: ``"auto"`` (default: ``"local"`` unless the model has LoRA layers), ``"local"`` (Megatron-style
            compute on local shards, ``local_tp``) or ``"dtensor"`` (torch's ``ColwiseParallel`` / ``RowwiseParallel``
            styles). Both place the parameters identically.

    Raises:
        ValueError: degrees whose product is not ``world_size``, a degree < 1 other than -1,
            ``sequence_parallel`` with ``tp == 1``. Every number is in the message.
    """

    dp: int
    sharding: int
    tp: int
    world_size: int
    sharding_stage: str | None = None
    offload: bool = False
    sequence_parallel: bool = False
    tensor_parallel_output: bool = False
    device_type: str = "cpu"
    tp_fp32_reduce: bool | None = None
    tp_impl: str = "auto"
    mesh: Any = field(default=None, repr=False)
    batch_mesh: Any = field(default=None, repr=False)

    def __post_init__(self):
        self._resolve()
        self._validate()

    def _resolve(self) -> None:
        self._dp_given = self.dp != -1
        for name in ("dp", "sharding", "tp"):
            v = getattr(self, name)
            if v != -1 and v < 1:
                raise ValueError(f"parallel degree {name}={v}: must be >= 1, or -1 to derive it from world_size")
        if self.tp == -1:
            self.tp = 1
        if self.sharding == -1:
            # PaddleNLP: with `sharding` set, the sharding degree takes what the other axes leave.
            if self.sharding_stage is None:
                self.sharding = 1
            elif self.dp == -1:
                self.sharding = max(self.world_size // self.tp, 1)
            else:
                self.sharding = max(self.world_size // (self.tp * self.dp), 1)
        if self.dp == -1:
            self.dp = max(self.world_size // (self.tp * self.sharding), 1)

    def _validate(self) -> None:
        prod = self.dp * self.sharding * self.tp
        # launchers leave dp at -1 (no such config key): say it was derived rather than name a key nobody set
        dp_part = (f"data_parallel_degree({self.dp})" if self._dp_given
                   else f"{self.dp} data-parallel replica(s) (derived)")
        if prod != self.world_size:
            raise ValueError(
                f"parallel layout does not fill the world: {dp_part} x "
                f"sharding_parallel_degree({self.sharding}) x tensor_parallel_degree({self.tp}) = {prod}, "
                f"but world_size = {self.world_size} (processes started by torchrun). Choose "
                f"tensor_parallel_degree and sharding_parallel_degree so that their product divides "
                f"{self.world_size} (the data-parallel replicas take the rest), or leave sharding_parallel_degree "
                f"at -1 to derive it."
            )
        if self.sharding > 1 and self.sharding_stage is None:
            raise ValueError(
                f"sharding_parallel_degree={self.sharding} > 1 but `sharding` is empty: set sharding to "
                f"\"stage1\", \"stage2\" or \"stage3\", or set sharding_parallel_degree=1."
            )
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel=True needs tensor_parallel_degree > 1 (got 1); "
                             "PaddleNLP rejects it too")

    # ---- derived sizes --------------------------------------------------------------------------------------
    @property
    def batch_world_size(self) -> int:
        """Number of distinct data slices per global batch: ``dp x sharding`` (PaddleNLP dataset_world_size)."""
        return self.dp * self.sharding

    @property
    def fsdp_enabled(self) -> bool:
        """True when FSDP2 ``fully_shard`` is applied (any data parallelism, replicated or sharded)."""
        return self.dp * self.sharding > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def batch_rank(self) -> int:
        """This rank's index among the ``dp x sharding`` data slices (0 without a mesh)."""
        if self.mesh is None:
            return 0
        return self.mesh.get_local_rank("dp") * self.sharding + self.mesh.get_local_rank("sharding")

    @property
    def tp_rank(self) -> int:
        return 0 if self.mesh is None else self.mesh.get_local_rank("tp")

    # ---- model checks ---------------------------------------------------------------------------------------
    def check_model_config(self, config: Any) -> None:
        """Check that a model config splits under this layout (called by ``parallelize_model``).

        Reads ``num_attention_heads``, ``num_key_value_heads`` (defaults to heads), ``intermediate_size``.

        Raises:
            ValueError: heads, KV heads or intermediate size not divisible by ``tp``. KV heads fewer than
                ``tp`` are rejected: replicating K/V would need the model to pick its local KV heads, which
                model code (no parallelism) does not do.
        """
        if self.tp == 1:
            return
        heads = getattr(config, "num_attention_heads")
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        inter = getattr(config, "intermediate_size", None)
        errors = []
        if heads % self.tp:
            errors.append(f"num_attention_heads={heads} is not divisible by tensor_parallel_degree={self.tp}")
        if kv_heads % self.tp:
            errors.append(
                f"num_key_value_heads={kv_heads} is not divisible by tensor_parallel_degree={self.tp}"
                + (" (fewer KV heads than TP ranks: each rank would need a replicated KV head, which is not "
                   "supported; lower tensor_parallel_degree to a divisor of the KV heads)"
                   if kv_heads < self.tp else "")
            )
        if inter is not None and inter % self.tp:
            errors.append(f"intermediate_size={inter} is not divisible by tensor_parallel_degree={self.tp}")
        if errors:
            raise ValueError("model config does not split under tensor parallelism: " + "; ".join(errors))

    # ---- mesh -----------------------------------------------------------------------------------------------
    def build_mesh(self) -> None:
        """Build ``self.mesh`` (axes ``dp, sharding, tp``) and ``self.batch_mesh`` (axes ``batch, tp``).

        Needs an initialised default process group. Both meshes lay ranks out identically
        (``rank = (dp_i * sharding + sh_i) * tp + tp_i``); ``batch_mesh["batch"]`` is the flattened
        ``dp x sharding`` group used for token-count all-reduces.
        """
        from torch.distributed.device_mesh import init_device_mesh

        self.mesh = init_device_mesh(
            self.device_type, (self.dp, self.sharding, self.tp), mesh_dim_names=("dp", "sharding", "tp")
        )
        self.batch_mesh = init_device_mesh(
            self.device_type, (self.dp * self.sharding, self.tp), mesh_dim_names=("batch", "tp")
        )

    def fsdp_mesh(self):
        """Mesh for ``fully_shard``: 1D ``sharding`` mesh, or 2D ``(dp, sharding)`` for HSDP when dp > 1."""
        if self.dp > 1:
            return self.mesh["dp", "sharding"]
        return self.mesh["sharding"]

    def tp_mesh(self):
        return self.mesh["tp"]


def _arg(args: Any, name: str, default: Any) -> Any:
    v = getattr(args, name, default)
    return default if v is None else v


def init_distributed(training_args: Any) -> ParallelDims:
    """Initialise ``torch.distributed`` (when launched by torchrun) and return the validated layout.

    Reads from ``training_args`` (PaddleNLP names): ``tensor_parallel_degree``, ``sharding_parallel_degree``,
    ``data_parallel_degree`` (optional; Paddle derives it), ``sharding``, ``sequence_parallel``,
    ``tensor_parallel_output``. World size and rank come from the torchrun environment
    (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``).

    Without torchrun (``WORLD_SIZE`` unset or 1) nothing is initialised and ``mesh`` is None: every helper in
    this package is then a no-op. The backend is NCCL on CUDA, gloo otherwise.

    Returns:
        ``ParallelDims`` with its mesh built.

    Raises:
        ValueError: degrees that do not multiply to the world size (see ``ParallelDims``);
            ``pipeline_parallel_degree``, ``sep_parallel_degree`` or ``context_parallel_degree`` > 1.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    for key in ("pipeline_parallel_degree", "sep_parallel_degree", "context_parallel_degree"):
        if int(_arg(training_args, key, -1)) > 1:
            raise ValueError(f"training argument `{key}`={_arg(training_args, key, -1)}: pipeline, sep and context "
                             f"parallelism are not implemented; set it to 1 (or -1) and use tensor_parallel_degree / "
                             f"sharding_parallel_degree")
    stage, offload = parse_sharding(_arg(training_args, "sharding", None))
    use_cuda = torch.cuda.is_available() and _arg(training_args, "device", "gpu") != "cpu"
    dims = ParallelDims(
        dp=int(_arg(training_args, "data_parallel_degree", -1)),
        sharding=int(_arg(training_args, "sharding_parallel_degree", -1)),
        tp=int(_arg(training_args, "tensor_parallel_degree", -1)),
        world_size=world_size,
        sharding_stage=stage,
        offload=offload,
        sequence_parallel=bool(_arg(training_args, "sequence_parallel", False)),
        tensor_parallel_output=bool(_arg(training_args, "tensor_parallel_output", False)),
        device_type="cuda" if use_cuda else "cpu",
    )
    if world_size == 1:
        return dims
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    dims.build_mesh()
    return dims
