"""Gateway usage records against vLLM's own token counters, read from the region's Prometheus.

The engines count every token they process (``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``);
the gateway records the tokens of the requests it routed. A gap means traffic that bypassed the gateway,
records lost on the way, or an engine restart inside the window (its counter starts again from zero and
the growth before the restart is not counted here). Mirrored requests count here, unlike in any tenant's
figures: the engines did process them.
"""

import re
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.db.models import Sum
from django.utils import timezone

from billing.models import UsageRecord
from billing.selectors import served_by_engines
from core.choices import Scope
from core.principal import Principal
from regions.drivers.prometheus import prometheus_client
from regions.models import DeploymentTarget, Region

COUNTERS = {"prompt_tokens": "vllm:prompt_tokens_total", "completion_tokens": "vllm:generation_tokens_total"}


def crosscheck(actor: Principal, region: Region, minutes: int) -> dict[str, Any]:
    actor.require(Scope.BILLING_WRITE)  # operators: it reads every tenant's usage in the region
    if not region.prometheus_url:
        return {"region": region.code, "error": "the region names no Prometheus"}
    prometheus = prometheus_client(region.prometheus_url)
    since = timezone.now() - timedelta(minutes=minutes)
    in_region = UsageRecord.objects.filter(region=region.code, started_at__gte=since)
    recorded = served_by_engines(in_region).aggregate(
        prompt_tokens=Sum("prompt_tokens"), completion_tokens=Sum("completion_tokens")
    )
    found: dict[str, Any] = {"region": region.code, "minutes": minutes}
    # Only this region's engines, should one Prometheus scrape several regions.
    urls = [url for target in DeploymentTarget.objects.filter(region=region) for url in target.endpoints]
    instances = "|".join(re.escape(urlsplit(url).netloc) for url in urls) or "none"
    for key, metric in COUNTERS.items():
        selector = f"{metric}{{instance=~`{instances}`}}[{minutes}m]"  # a raw string: no escapes
        # Growth inside the window from the samples themselves: increase() would extrapolate to the window's
        # edges and give fractions of tokens.
        series = prometheus.custom_query(f"sum(max_over_time({selector}) - min_over_time({selector}))")
        engine = round(float(series[0]["value"][1])) if series else 0
        gateway = int(recorded[key] or 0)
        found[key] = {"engines": engine, "gateway": gateway, "discrepancy": engine - gateway}
    return found
