"""A real Redis for the tests that share state through one (the gateway's fleet limits): database 2 of the
local Redis (REDIS_URL's database 1 is the control plane's cache, which tests clear), or
GATEWAY_TEST_REDIS_URL. Without one the tests skip, except in CI, which starts Redis and must run them."""

import asyncio
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")


@pytest.fixture
def redis_url() -> str:
    try:
        redis.Redis.from_url(URL, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Redis at {URL} ({exc})")
    return URL


def fresh_tenant() -> str:
    """A tenant name no other test (or earlier run) has used: its keys in Redis start empty."""
    return f"t-{uuid.uuid4().hex[:12]}"


def run(coroutine):  # type: ignore[no-untyped-def]
    """The story in an event loop of its own, on a thread of its own: the main thread may already run one
    (Playwright's sync API leaves its loop there once a browser test has run)."""
    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(asyncio.run, coroutine).result(timeout=120)
