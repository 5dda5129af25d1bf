"""The process driver is shared by a region's reconcile threads: what one apply measures stays its own."""

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from core.errors import ValidationFailed
from regions.drivers import process
from regions.drivers.process import ProcessConfig, ProcessDriver, _health
from tests.support.regions import process_spec as spec


def replica_state(root: Path, name: str) -> dict:
    return json.loads((root / name / "replica-0.json").read_text())


def test_interleaved_applies_keep_their_own_cold_start_timings(tmp_path, tiny_model_dir, monkeypatch):
    """Another thread's apply of another workload runs while this one starts its engine (one driver per
    region, cached): each replica still records when its own apply was scheduled and its weights cached."""
    driver = ProcessDriver(ProcessConfig(state_dir=str(tmp_path / "state"), engine="simulator"))
    root = Path(driver.config.state_dir)
    first, second = spec("cp-1-first", tiny_model_dir), spec("cp-2-second", tiny_model_dir)
    popen, interleaved = subprocess.Popen, []

    def start_engine(command, *args, **kwargs):  # type: ignore[no-untyped-def]
        if first.served_model_name in command and not interleaved:
            interleaved.append(True)
            time.sleep(0.05)
            driver.apply(second)  # another reconcile thread, between this apply's timing and its start
        return popen(command, *args, **kwargs)

    monkeypatch.setattr(process.subprocess, "Popen", start_engine)
    try:
        driver.apply(first)
        mine, theirs = replica_state(root, first.name), replica_state(root, second.name)
    finally:
        for name in (first.name, second.name):
            driver.delete(name)
    assert interleaved
    assert mine["scheduled_at"] <= mine["cached_at"] < theirs["scheduled_at"] <= theirs["cached_at"]
    assert mine["cached_at"] <= mine["started_at"]


def test_a_health_check_tells_a_busy_engine_from_a_dead_one():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)  # accepts the connection, never answers: an engine whose one thread is generating
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    closed_port = dead.getsockname()[1]
    dead.close()
    try:
        assert _health("127.0.0.1", busy.getsockname()[1]) == "slow"
        assert _health("127.0.0.1", closed_port) == "down"
    finally:
        busy.close()


def test_an_otlp_endpoint_makes_vllm_continue_the_gateways_traces(tmp_path, tiny_model_dir):
    config = ProcessConfig.parse(
        {"engine": "vllm", "otlp_traces_endpoint": "http://otel:4318/v1/traces"}, str(tmp_path)
    )
    command = ProcessDriver(config)._command(spec("chat", tiny_model_dir), 8001, str(tiny_model_dir))
    assert command[-2:] == ["--otlp-traces-endpoint", "http://otel:4318/v1/traces"]
    plain = ProcessDriver(ProcessConfig.parse({"engine": "vllm"}, str(tmp_path)))
    assert "--otlp-traces-endpoint" not in plain._command(
        spec("chat", tiny_model_dir), 8001, str(tiny_model_dir)
    )
    for bad in ("ftp://otel", "otel:4318", 4318, "http://otel\x00", "http://" + "a" * 600):
        with pytest.raises(ValidationFailed):
            ProcessConfig.parse({"otlp_traces_endpoint": bad}, str(tmp_path))
