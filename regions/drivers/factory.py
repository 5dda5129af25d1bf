"""Builds the driver of a region from its typed configuration; one client per region, reused."""

import json
from functools import lru_cache

from django.conf import settings

from regions.choices import DriverKind
from regions.drivers.base import WorkloadDriver
from regions.drivers.kubernetes import KubernetesConfig, KubernetesDriver
from regions.drivers.process import ProcessConfig, ProcessDriver
from regions.models import Region


def default_state_dir(region_code: str) -> str:
    return str(settings.VAR_DIR / "regions" / region_code)


def validate_driver_config(driver: str, raw: dict[str, object], region_code: str) -> None:
    """Raises ValidationFailed naming the problem; called when a region is created or changed."""
    if driver == DriverKind.KUBERNETES:
        KubernetesConfig.parse(dict(raw))
    else:
        ProcessConfig.parse(dict(raw), default_state_dir(region_code))


@lru_cache(maxsize=256)
def _build(driver: str, code: str, raw: str) -> WorkloadDriver:
    config = json.loads(raw)
    if driver == DriverKind.KUBERNETES:
        return KubernetesDriver(KubernetesConfig.parse(config))
    return ProcessDriver(ProcessConfig.parse(config, default_state_dir(code)))


def driver_for(region: Region) -> WorkloadDriver:
    return _build(region.driver, region.code, json.dumps(region.driver_config, sort_keys=True))


def engine_of(region: Region) -> str:
    """Which engine a process region runs (vllm or simulator); "kubernetes" for clusters."""
    if region.driver == DriverKind.KUBERNETES:
        return "vllm (container)"
    return ProcessConfig.parse(dict(region.driver_config), default_state_dir(region.code)).resolved_engine
