"""The vLLM engine arguments the platform supports, typed, and their rendering as CLI flags.

Names are the CLI flag names with underscores (``max_model_len`` ↔ ``--max-model-len``); the set and
their bounds follow vLLM's ``EngineArgs``. Anything outside it is refused
at registration with a message naming the argument, instead of surfacing later as a crash-looping
engine. When vLLM itself is installed, its own parser checks the rendered flags too.
"""

import functools
import importlib.util
from dataclasses import dataclass
from typing import Any

from core.errors import ValidationFailed

QUANTIZATIONS = (
    "awq",
    "auto_awq",
    "fp8",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mxfp8",
    "modelopt_mixed",
    "auto_gptq",
    "gptq",
    "gptq_marlin",
    "awq_marlin",
    "compressed-tensors",
    "experts_int8",
    "quark",
    "moe_wna16",
    "torchao",
    "inc",
    "mxfp4",
    "gpt_oss_mxfp4",
    "fp8_per_tensor",
    "fp8_per_block",
    "fp8_per_channel",
    "int8_per_channel_weight_only",
    "mxfp8",
)
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


@dataclass(frozen=True)
class ArgSpec:
    kind: type
    help: str
    minimum: float | int | None = None
    maximum: float | int | None = None
    choices: tuple[Any, ...] = ()
    exclusive_minimum: bool = False

    def check(self, name: str, value: Any) -> str | None:
        """The problem with ``value``, or None."""
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if type(value) is not self.kind:
            return f"{name} must be {self.kind.__name__}, got {type(value).__name__} {value!r}"
        if self.choices and value not in self.choices:
            return f"{name} must be one of {', '.join(map(str, self.choices))}; got {value!r}"
        return self._check_range(name, value) if isinstance(value, int | float) else None

    def _check_range(self, name: str, value: float) -> str | None:
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.exclusive_minimum else value < low):
            return f"{name} must be {'>' if self.exclusive_minimum else '≥'} {low}; got {value!r}"
        if high is not None and value > high:
            return f"{name} must be ≤ {high}; got {value!r}"
        return None


ENGINE_ARGS: dict[str, ArgSpec] = {
    "tensor_parallel_size": ArgSpec(int, "GPUs one replica shards each layer over", 1, 64),
    "pipeline_parallel_size": ArgSpec(int, "pipeline stages (nodes) per replica", 1, 64),
    "data_parallel_size": ArgSpec(int, "data-parallel engine copies inside one server", 1, 64),
    "max_model_len": ArgSpec(int, "context length in tokens (prompt + output)", 16, 10_000_000),
    "gpu_memory_utilization": ArgSpec(
        float, "share of GPU memory vLLM may use", 0.0, 1.0, exclusive_minimum=True
    ),
    "max_num_seqs": ArgSpec(int, "sequences batched together at most", 1, 65536),
    "max_num_batched_tokens": ArgSpec(int, "tokens per scheduler step at most", 16, 10_000_000),
    "dtype": ArgSpec(str, "weight and activation dtype", choices=DTYPES),
    "quantization": ArgSpec(str, "weight quantization method", choices=QUANTIZATIONS),
    "kv_cache_dtype": ArgSpec(str, "KV cache dtype", choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2")),
    "block_size": ArgSpec(int, "KV cache block size in tokens", choices=(8, 16, 32, 64, 128)),
    "enable_prefix_caching": ArgSpec(bool, "reuse KV cache across requests sharing a prefix"),
    "enable_chunked_prefill": ArgSpec(bool, "split long prefills into chunks"),
    "enforce_eager": ArgSpec(bool, "disable CUDA graphs"),
    "enable_lora": ArgSpec(bool, "serve LoRA adapters"),
    "max_loras": ArgSpec(int, "LoRA adapters in one batch at most", 1, 1024),
    "max_lora_rank": ArgSpec(int, "largest LoRA rank", 1, 512),
    "seed": ArgSpec(int, "random seed", 0, 2**32 - 1),
    "load_format": ArgSpec(str, "weight loader", choices=("auto", "safetensors", "pt", "gguf", "dummy")),
    "tokenizer_mode": ArgSpec(str, "tokenizer implementation", choices=("auto", "slow", "mistral")),
    "swap_space": ArgSpec(float, "CPU swap space per GPU in GiB", 0, 1024),
    "max_logprobs": ArgSpec(int, "log-probabilities returned at most", 0, 1000),
    # Set for embedding, reranking and classification models by the platform (their model's task).
    "runner": ArgSpec(str, "what the engine runs the model for", choices=("auto", "generate", "pooling")),
}


def validate_engine_args(args: object, *, field: str = "engine_args") -> dict[str, Any]:
    """The arguments if every one is known and well-typed; else one error naming each bad argument."""
    if not isinstance(args, dict):
        raise ValidationFailed(f"{field} must be an object of argument names to values.")
    problems = {}
    for name, value in args.items():
        spec = ENGINE_ARGS.get(name)
        if spec is None:
            problems[name] = f"unknown engine argument '{name}' (supported: {', '.join(sorted(ENGINE_ARGS))})"
        elif error := spec.check(name, value):
            problems[name] = error
    if problems:
        raise ValidationFailed(f"Invalid {field}: " + "; ".join(problems.values()), detail={field: problems})
    normalised = {name: float(v) if ENGINE_ARGS[name].kind is float else v for name, v in args.items()}
    check_with_vllm(normalised, field=field)
    return normalised


def render_flags(args: dict[str, Any]) -> list[str]:
    """CLI flags for ``vllm serve`` / ``python -m vllm.entrypoints.openai.api_server``, in a stable order."""
    flags: list[str] = []
    for name in sorted(args):
        flag = "--" + name.replace("_", "-")
        value = args[name]
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags += [flag, str(value)]
    return flags


def vllm_available() -> bool:
    """vLLM is optional on purpose (the ``engine`` extra: GPU hosts and the test suite have it, a control
    plane installed with ``pip install .`` does not): without it the flags are checked by our typed schema
    only, and vLLM's own parser adds its check wherever it is installed."""
    return importlib.util.find_spec("vllm") is not None


@functools.cache
def _vllm_parser() -> Any:
    # Importing vLLM takes seconds; build its parser once per process.
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return AsyncEngineArgs.add_cli_args(FlexibleArgumentParser(exit_on_error=False))


def check_with_vllm(args: dict[str, Any], *, field: str = "engine_args") -> None:
    """Parse the flags with the installed vLLM's own argument parser, when vLLM is installed."""
    if not args or not vllm_available():
        return
    try:
        _vllm_parser().parse_args(["--model", "placeholder", *render_flags(args)])
    except (SystemExit, Exception) as exc:  # argparse reports through SystemExit or ArgumentError
        raise ValidationFailed(f"vLLM rejects {field}: {exc}", detail={field: str(exc)}) from exc
