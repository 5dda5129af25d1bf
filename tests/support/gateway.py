"""The gateway as its own process (uvicorn) in front of the live control plane, called like an OpenAI client
would, and the local fleet behind it: engines in two EU regions, a gateway's token, killing engines."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from core.choices import PlatformRole, Scope
from core.services.tenants import service_account_create
from core.services.tokens import token_create
from regions.models import DeploymentTarget
from regions.services.deployments import deployment_create
from tests.support.principals import principal
from tests.support.processes import child_env, free_port, wait_for
from tests.support.regions import converge, replica_pids, tiny_version

LOCATIONS = {"eu-west-1": (53.3, -6.3), "eu-central-1": (50.1, 8.7), "us-east-1": (38.9, -77.0)}


class Gateway:
    def __init__(self, control_plane: str, token: str, cache: Path, log: Path, *args: str, **settings: str):
        """``args``: more of its command line (``--entry``); ``settings``: more of its environment
        (GATEWAY_HOLD_TIMEOUT_SECONDS="3", ...)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = child_env(
            CONTROL_PLANE_URL=control_plane,
            GATEWAY_TOKEN=token,
            GATEWAY_CACHE_FILE=str(cache),
            GATEWAY_LONG_POLL_SECONDS="2",  # a poll still open when a test ends would outlive its database
            GATEWAY_STAGE_NETWORKS="127.0.0.0/8",  # pipelines' http stages in tests run on this host
            **settings,
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--port", str(self.port), *args],
            env=env,
            stdout=log.open("a"),
            stderr=subprocess.STDOUT,
        )
        wait_for(self._has_table, timeout=30)

    def _has_table(self) -> bool:
        try:
            return bool(requests.get(f"{self.url}/healthz", timeout=1).json()["generation"])
        except (requests.RequestException, ValueError):
            return False

    def generation(self) -> int:
        return int(requests.get(f"{self.url}/healthz", timeout=1).json()["generation"])

    def health(self) -> dict:  # type: ignore[type-arg]
        return requests.get(f"{self.url}/healthz", timeout=1).json()  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)


def chat(gateway: Gateway, token: str, model: str = "chat", **extra):  # type: ignore[no-untyped-def]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 8,
        **extra,
    }
    return requests.post(
        f"{gateway.url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def stream_chat(gateway: Gateway, token: str, max_tokens: int = 16, content: str = "hi", timeout: float = 30):  # type: ignore[no-untyped-def]
    """A streamed chat: (the response's headers, its ``data:`` lines)."""
    with requests.post(
        f"{gateway.url}/v1/chat/completions",
        json={
            "model": "chat",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": True,
        },
        headers={"Authorization": f"Bearer {token}"},
        stream=True,
        timeout=timeout,
    ) as streamed:
        events = [line for line in streamed.iter_lines() if line.startswith(b"data: ")]
        return streamed.headers, events


def chat_in_two_eu_regions(world, make_region, tiny_model_dir, jurisdictions):  # type: ignore[no-untyped-def]
    """acme (home eu-west-1) runs `chat` in eu-west-1 and eu-central-1, ready: (deployment, regions)."""
    regions = {}
    for code, jurisdiction in jurisdictions.items():
        regions[code] = make_region(code, jurisdiction)
        regions[code].latitude, regions[code].longitude = LOCATIONS[code]
        regions[code].save()
    world.tenant_a.home_region = "eu-west-1"
    world.tenant_a.save()
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="chat",
        model=version.model,
        version="1.0.0",
        regions=["eu-west-1", "eu-central-1"],
        min_regions=2,
    )
    wait_for(lambda: all_ready(deployment), timeout=60, interval=0.3)
    return deployment, regions


def gateway_secret(world, regions: list[str] | None = None) -> str:  # type: ignore[no-untyped-def]
    """A platform robot's token with gateway:sync, as a gateway holds (its account bound to ``regions``)."""
    robot = service_account_create(
        actor=principal(world.admin),
        name=f"gateway-{'-'.join(regions)}" if regions else "gateway",
        role=PlatformRole.ADMIN,
        regions=regions,
    )
    return token_create(
        actor=principal(world.admin), name="gw", scopes=[Scope.GATEWAY_SYNC], service_account=robot
    )[1]


def all_ready(deployment) -> bool:  # type: ignore[no-untyped-def]
    converge(deployment)
    targets = DeploymentTarget.objects.filter(deployment=deployment)
    return targets.count() == 2 and all(t.status == "ready" for t in targets)


def kill_engines(region, deployment) -> None:  # type: ignore[no-untyped-def]
    for pid in replica_pids(region, deployment):
        os.killpg(pid, signal.SIGKILL)  # the engine and its children (vLLM's engine core)
