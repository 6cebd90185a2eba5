"""Facts about a machine and a checkpoint: the data models only. Pure.

gather.py fills them (by probing, or from a recorded $QPNSERVE_FACTS_FILE); the checks
(checks*.py) are pure functions of them. A probe that cannot find something records that as a
fact (``nvml_ok=False`` with the error) instead of raising. The checkpoint's records are frozen:
checkpoint.py reads the files once and builds them whole, and no check changes or re-derives them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SkipValidation

from qpnserve.host import HostInfo

FACTS_SCHEMA_VERSION = 1


class GpuDevice(BaseModel):
    index: int  # NVML index (not necessarily the CUDA index)
    name: str  # "Tesla V100-SXM2-32GB"
    compute_capability: str  # "7.0"
    memory_total_mib: int
    uuid: str | None = None


class GpuFacts(BaseModel):
    nvml_ok: bool
    error: str | None = None  # why NVML could not report (no driver, no library, no GPU)
    driver_version: str | None = None  # "570.124.06"
    cuda_driver_version: str | None = None  # newest CUDA the driver supports, "12.8"
    devices: list[GpuDevice] = []
    # CUDA_VISIBLE_DEVICES as the server would see it; None = unset (all devices visible).
    cuda_visible_devices: str | None = None


class TorchFacts(BaseModel):
    installed: bool
    version: str | None = None  # "2.10.0+cu128"
    cuda_version: str | None = None  # torch.version.cuda; None for a CPU-only build
    arch_list: list[str] | None = None  # ["sm_70", "sm_80", ...]; None = could not tell
    arch_source: str | None = None  # how arch_list was found (e.g. "fatbin:libtorch_cuda.so")
    error: str | None = None


class NvccFacts(BaseModel):
    found: bool
    path: str | None = None
    version: str | None = None  # "12.8"
    error: str | None = None


class ShardFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    file: str
    exists: bool
    header_ok: bool = False
    error: str | None = None
    num_tensors: int = 0


class CheckpointLayout(BaseModel):
    """What config.json and the tensor names say about the layout, derived once by
    layout.read_layout when the checkpoint is gathered; the checkpoint checks only read it."""

    model_config = ConfigDict(frozen=True)

    text: dict[str, Any]  # the text model's config: text_config, else config.json's top level
    quantization: dict[str, Any] | None  # quantization_config (top level, else text_config)
    quant_method: str  # its quant_method, lower-cased; "" without one
    layer_prefix: str  # the decoder layers' tensor-name prefix, "model.language_model.layers."
    moe_layers: tuple[int, ...]  # decoder layers whose MLP is a sparse MoE block
    quantized_moe_layers: tuple[int, ...]  # of those, the ones whose experts are AWQ tensors
    unquantized_moe_layers: tuple[int, ...]  # the rest: kept by modules_to_not_convert


class CheckpointFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    exists: bool = False
    is_dir: bool = False
    readable: bool = False
    error: str | None = None  # why the directory itself could not be read
    config: dict | None = None  # config.json as parsed
    config_error: str | None = None
    index_file: str | None = None  # "model.safetensors.index.json", or None (single shard)
    index_error: str | None = None
    shards: list[ShardFacts] = []
    unindexed_files: list[str] = []  # *.safetensors files on disk that the index never names
    num_tensors: int = 0
    # None without a readable config.json. Kept out of the JSON output: it restates `config`.
    layout: CheckpointLayout | None = Field(default=None, exclude=True)
    # The two big tables are kept out of the JSON output (hundreds of thousands of rows for the
    # full model) and are taken without validation from the probe.
    # tensor name -> (safetensors dtype name "I32"/"F16"/..., shape), from the shard headers
    tensors: SkipValidation[dict[str, tuple[str, tuple[int, ...]]]] = Field(
        default_factory=dict, exclude=True
    )
    # tensor name -> shard file, from the index (empty without an index)
    index_weight_map: SkipValidation[dict[str, str]] = Field(default_factory=dict, exclude=True)


class Facts(BaseModel):
    schema_version: int = FACTS_SCHEMA_VERSION
    source: Literal["probed", "recorded"] = "probed"
    # "recorded": the $QPNSERVE_FACTS_FILE that stood in for the machine (recorded or written
    # by hand; the checkpoint is still probed).
    source_file: str | None = None
    hostname: str = ""
    gpu: GpuFacts | None = None  # None: the gpu group was not probed
    torch: TorchFacts | None = None  # torch, nvcc, host, env: the toolchain group
    nvcc: NvccFacts | None = None
    host: HostInfo | None = None
    env: dict[str, str] | None = None  # the VLLM_*/CUDA_* variables that decide the route
    checkpoint: CheckpointFacts | None = None


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """ "12.8" -> (12, 8), "2.10.0+cu128" -> (2, 10, 0), "" or None -> None."""
    if not text:
        return None
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None
