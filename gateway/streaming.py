"""Server-sent events from the engine, event by event: the usage is read from them, and the usage-only
final chunk (``"choices": []``), which the gateway asks for to meter the request, is forwarded only when
the client asked for it too (OpenAI clients reading ``chunk.choices[0]`` would crash on it)."""

import json
from typing import Any

SEPARATORS = (b"\r\n\r\n", b"\n\n")
LONGEST_EVENT = 2**20  # an engine that never ends an event is passed through rather than buffered


class EventFilter:
    def __init__(self, forward_usage_chunk: bool):
        self.forward_usage_chunk = forward_usage_chunk
        self.usage: dict[str, Any] = {}
        self.buffer = b""

    def feed(self, data: bytes) -> bytes:
        """What to send on now: the whole events received so far, less a usage-only chunk."""
        self.buffer += data
        out = []
        while True:
            found = [(at, sep) for sep in SEPARATORS if (at := self.buffer.find(sep)) >= 0]
            if not found:
                break
            at, sep = min(found)
            event, self.buffer = self.buffer[: at + len(sep)], self.buffer[at + len(sep) :]
            if self._forward(event):
                out.append(event)
        if len(self.buffer) > LONGEST_EVENT:
            out.append(self.flush())
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self.buffer = self.buffer, b""
        return rest

    def _forward(self, event: bytes) -> bool:
        if b'"usage"' not in event:
            return True
        for line in event.splitlines():
            if not line.startswith(b"data: {"):
                continue
            try:
                chunk = json.loads(line[6:])
            except ValueError:
                return True
            if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
                self.usage = chunk["usage"]  # the last one counts (cumulative with continuous stats)
                return self.forward_usage_chunk or chunk.get("choices") != []
        return True
