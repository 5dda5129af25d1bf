"""Prefix-aware endpoint choice: send a prompt to the engine that most recently served its longest prefix,
where vLLM's prefix cache likely still holds the KV blocks, as llm-d's approximate prefix scorer and Ray
Serve's prefix router do.

The prompt is flattened (chat messages in order, role and content, so a shared system prompt comes
first) and cut into fixed blocks of characters; each block's hash chains the ones before it, so a hash
names a whole prefix. An index (bounded, least recently used out first) maps prefix hashes to the
endpoint that last served them. The chain starts from the tenant: tenants' prompts never name one
another's prefixes, just as the engines' caches are salted per tenant on shared deployments.

The preference is only a preference: when the preferred engine already has ``imbalance`` more requests
in flight from this gateway than the least busy one of the tier, load wins and the request goes to the
balancer's choice (a popular system prompt must not pile every request onto one engine). Session
affinity (``x-session-id``, ``user``) keeps precedence: a conversation stays on its engine.
"""

import hashlib
from collections import OrderedDict
from typing import Any

from gateway import contract

BLOCK_CHARS = 256  # about 64 tokens: coarser than vLLM's 16-token blocks, enough to tell prompts apart
MAX_BLOCKS = 64  # prefixes longer than 16 K characters are told apart by their first 16 K


def prompt_blocks(tenant: str, payload: dict[str, Any]) -> list[bytes]:
    """The chained hash of every whole block of the prompt's flattened text (none: nothing to match)."""
    text = _flatten(payload)
    if len(text) < BLOCK_CHARS:
        return []
    chain = hashlib.blake2b(tenant.encode(), digest_size=16).digest()
    hashes = []
    for start in range(0, min(len(text) - BLOCK_CHARS + 1, MAX_BLOCKS * BLOCK_CHARS), BLOCK_CHARS):
        block = text[start : start + BLOCK_CHARS].encode("utf-8", "surrogatepass")
        chain = hashlib.blake2b(chain + block, digest_size=16).digest()
        hashes.append(chain)
    return hashes


def _flatten(payload: dict[str, Any]) -> str:
    """The prompt's text up to what the blocks look at (a 10 MiB body is not copied whole)."""
    limit = MAX_BLOCKS * BLOCK_CHARS
    messages = payload.get("messages")
    if isinstance(messages, list):
        parts, size = [], 0
        for message in messages:
            if size >= limit:
                break
            if isinstance(message, dict):
                part = f"{message.get('role')}\n{_text(message.get('content'), limit)}\n"
                parts.append(part)
                size += len(part)
        return "".join(parts)[:limit]
    prompt = payload.get("prompt")
    return prompt[:limit] if isinstance(prompt, str) else ""


def _text(content: Any, limit: int) -> str:
    """A message's text: a string, or the text parts of OpenAI's content list (images are not text)."""
    if isinstance(content, str):
        return content[:limit]
    if not isinstance(content, list):
        return ""
    texts, size = [], 0
    for part in content:
        text = part.get("text") if isinstance(part, dict) else None
        if isinstance(text, str) and size < limit:
            texts.append(text[: limit - size])
            size += len(texts[-1])
    return "".join(texts)


class PrefixIndex:
    def __init__(self, capacity: int = 100_000, imbalance: int = 4):
        self.capacity, self.imbalance = capacity, imbalance
        self.owner: OrderedDict[bytes, str] = OrderedDict()  # prefix hash → endpoint URL
        self.counts = {"matched": 0, "unmatched": 0, "overloaded": 0}

    def prefer(
        self, tier: list[contract.Endpoint], hashes: list[bytes], in_flight: dict[str, int]
    ) -> contract.Endpoint | None:
        """The tier's endpoint that served the longest prefix of these, unless it is too busy."""
        by_url = {e["url"]: e for e in tier}
        for prefix in reversed(hashes):
            url = self.owner.get(prefix)
            if url in by_url:
                least = min(in_flight.get(u, 0) for u in by_url)
                if in_flight.get(url, 0) - least > self.imbalance:
                    self.counts["overloaded"] += 1
                    return None
                self.counts["matched"] += 1
                return by_url[url]
        self.counts["unmatched"] += 1
        return None

    def remember(self, hashes: list[bytes], url: str) -> None:
        for prefix in hashes:
            self.owner[prefix] = url
            self.owner.move_to_end(prefix)
        while len(self.owner) > self.capacity:
            self.owner.popitem(last=False)

    def stats(self) -> dict[str, int]:
        return {**self.counts, "entries": len(self.owner)}
