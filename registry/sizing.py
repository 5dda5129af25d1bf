"""GPU memory estimate of a model version and the smallest GPU type and count that fits it.

weights   = parameters × bytes per parameter (from dtype, or from the quantization when set)
KV cache  = 2 (K and V) × layers × KV heads × head dim × bytes per element × context × concurrency
total     = (weights + KV cache) × 1.10 (activations, CUDA graphs, fragmentation) + 1 GiB per GPU (context)

A GPU type fits with N GPUs (N a power of two, as tensor parallelism requires) when total fits in
N × memory × gpu_memory_utilization. Without the architecture (layers, KV heads, head dim) the KV cache
cannot be computed and the estimate says so instead of guessing.
"""

from dataclasses import asdict, dataclass
from typing import Any

GIB = 1024**3
OVERHEAD_FACTOR = 1.10
PER_GPU_CONTEXT_BYTES = 1 * GIB
DEFAULT_UTILIZATION = 0.92  # vLLM 0.33's default --gpu-memory-utilization

# Memory per GPU type in GiB (what the GPU pools of regions are made of).
GPU_TYPES: dict[str, int] = {
    "L4": 24,
    "A10G": 24,
    "L40S": 48,
    "A100-40GB": 40,
    "A100-80GB": 80,
    "H100": 80,
    "H200": 141,
    "B200": 180,
}
DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0, "auto": 2.0}
QUANT_BYTES = {
    "fp8": 1.0,
    "fp8_per_tensor": 1.0,
    "fp8_per_block": 1.0,
    "fp8_per_channel": 1.0,
    "mxfp8": 1.0,
    "int8_per_channel_weight_only": 1.0,
    "experts_int8": 1.0,
    "awq": 0.5,
    "auto_awq": 0.5,
    "awq_marlin": 0.5,
    "gptq": 0.5,
    "auto_gptq": 0.5,
    "gptq_marlin": 0.5,
    "mxfp4": 0.5,
    "modelopt_fp4": 0.5,
    "gpt_oss_mxfp4": 0.5,
}
KV_DTYPE_BYTES = {"fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}


@dataclass(frozen=True)
class GpuFit:
    gpu_type: str
    gpu_count: int
    memory_gib: int


@dataclass(frozen=True)
class SizingEstimate:
    weights_gib: float
    kv_cache_gib: float | None
    total_gib: float
    context_length: int
    concurrency: int
    smallest_fit: GpuFit | None
    fits: list[GpuFit]
    notes: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _kv_bytes(architecture: dict[str, Any], kv_element_bytes: float, tokens: int) -> float | None:
    try:
        layers = int(architecture["num_hidden_layers"])
        kv_heads = int(architecture.get("num_key_value_heads") or architecture["num_attention_heads"])
        head_dim = int(
            architecture.get("head_dim") or architecture["hidden_size"] // architecture["num_attention_heads"]
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return 2 * layers * kv_heads * head_dim * kv_element_bytes * tokens


def _fits(total_bytes: float, utilization: float) -> list[GpuFit]:
    fits = []
    for gpu_type, memory_gib in GPU_TYPES.items():
        for count in (1, 2, 4, 8):
            usable = count * memory_gib * GIB * utilization - count * PER_GPU_CONTEXT_BYTES
            if total_bytes <= usable:
                fits.append(GpuFit(gpu_type, count, memory_gib))
                break
    # Smallest: least total GPU memory, then fewest GPUs.
    return sorted(fits, key=lambda f: (f.gpu_count * f.memory_gib, f.gpu_count))


def estimate(
    *,
    parameter_count: int,
    dtype: str,
    quantization: str,
    architecture: dict[str, Any],
    context_length: int,
    concurrency: int,
    engine_args: dict[str, Any],
) -> SizingEstimate:
    notes = []
    bytes_per_param = QUANT_BYTES.get(quantization) or DTYPE_BYTES.get(dtype, 2.0)
    weights = parameter_count * bytes_per_param
    kv_element = KV_DTYPE_BYTES.get(engine_args.get("kv_cache_dtype", ""), DTYPE_BYTES.get(dtype, 2.0))
    kv = _kv_bytes(architecture, kv_element, context_length * concurrency)
    if kv is None:
        notes.append(
            "KV cache not included: give architecture.num_hidden_layers, num_key_value_heads and head_dim."
        )
    total = (weights + (kv or 0)) * OVERHEAD_FACTOR
    utilization = float(engine_args.get("gpu_memory_utilization", DEFAULT_UTILIZATION))
    fits = _fits(total, utilization)
    if not fits:
        notes.append("Does not fit on 8 GPUs of any known type: use pipeline parallelism across nodes.")
    return SizingEstimate(
        weights_gib=round(weights / GIB, 2),
        kv_cache_gib=round(kv / GIB, 2) if kv is not None else None,
        total_gib=round(total / GIB, 2),
        context_length=context_length,
        concurrency=concurrency,
        smallest_fit=fits[0] if fits else None,
        fits=fits,
        notes=notes,
    )


def sizing_of(version: Any) -> dict[str, Any]:
    """The estimate for a registered model version (a ``registry.models.ModelVersion``)."""
    return estimate(
        parameter_count=version.parameter_count,
        dtype=version.dtype,
        quantization=version.quantization,
        architecture=version.architecture,
        context_length=version.max_context_length,
        concurrency=version.sizing_concurrency,
        engine_args=version.engine_args,
    ).as_dict()
