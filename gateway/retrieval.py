"""Tenants' retrieval indexes, searched by pipelines' retrieve stages: fetched from the control plane when
the route table names a newer revision, held in memory, searched exactly (faiss, inner product over
normalised vectors: cosine similarity). An index is small (at most 10,000 documents)."""

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import faiss
import numpy as np

from gateway import contract
from gateway.config import Settings


@dataclass(frozen=True)
class Loaded:
    revision: int
    index: Any  # faiss.IndexFlatIP
    documents: list[contract.IndexDocument]


class Indexes:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.loaded: dict[tuple[str, str], Loaded] = {}
        self.loading: dict[tuple[str, str], asyncio.Lock] = {}

    async def search(
        self, session: aiohttp.ClientSession, tenant: str, name: str, revision: int, vector: Any, top_k: int
    ) -> list[dict[str, Any]]:
        """The ``top_k`` documents nearest ``vector``: [{"key", "text", "score"}], nearest first."""
        loaded = await self._at_least(session, tenant, name, revision)
        query = np.asarray([vector], dtype=np.float32)
        if query.shape != (1, loaded.index.d):
            raise ValueError(f"the vector has {query.size} dimensions; index {name} has {loaded.index.d}")
        faiss.normalize_L2(query)
        scores, found = loaded.index.search(query, min(top_k, max(1, loaded.index.ntotal)))
        return [
            {"key": loaded.documents[i]["key"], "text": loaded.documents[i]["text"], "score": float(score)}
            for score, i in zip(scores[0], found[0], strict=True)
            if i >= 0
        ]

    async def _at_least(
        self, session: aiohttp.ClientSession, tenant: str, name: str, revision: int
    ) -> Loaded:
        key = (tenant, name)
        held = self.loaded.get(key)
        if held is not None and held.revision >= revision:
            return held
        async with self.loading.setdefault(key, asyncio.Lock()):  # one fetch at a time per index
            held = self.loaded.get(key)
            if held is None or held.revision < revision:
                held = self.loaded[key] = _build(await self._fetch(session, tenant, name))
        return held

    async def _fetch(self, session: aiohttp.ClientSession, tenant: str, name: str) -> contract.RetrievalIndex:
        url = f"{self.settings.control_plane}/api/v1/routing/indexes/{tenant}/{name}/?"
        url += self.settings.regions_query()  # refused (403) where the tenant's data may not be
        headers = {"Authorization": f"Bearer {self.settings.token}"}
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as answer:
            if answer.status != 200:
                raise ValueError(f"the control plane answered {answer.status} for index {name}")
            body: contract.RetrievalIndex = await answer.json()
            return body


def _build(body: contract.RetrievalIndex) -> Loaded:
    index = faiss.IndexFlatIP(body["dimensions"])
    if body["documents"]:
        vectors = np.asarray([d["vector"] for d in body["documents"]], dtype=np.float32)
        faiss.normalize_L2(vectors)
        index.add(vectors)
    # The vectors live in the index; the documents keep only what a prompt is given.
    kept: list[contract.IndexDocument] = [
        {"key": d["key"], "text": d["text"], "vector": []} for d in body["documents"]
    ]
    return Loaded(body["revision"], index, kept)
