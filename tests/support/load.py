"""Clients keeping streamed chats in flight through a gateway: load for the real-engine stories."""

import threading
import time
import uuid

import requests

from tests.support.gateway import Gateway


class Clients:
    """``count`` clients, each keeping one streamed chat in flight through the gateway, each a session."""

    def __init__(self, gateway: Gateway, token: str, count: int = 6, model: str = "chat"):
        self.gateway, self.token, self.model = gateway, token, model
        self.answers: list[tuple[float, int, str]] = []  # (when it was sent, status, x-model-version)
        self.stop = threading.Event()
        self.going = threading.Event()  # cleared while an engine starts: two cores cannot do both
        self.going.set()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self.going.wait(timeout=0.5):
                continue
            body = {
                "model": self.model,
                "messages": [{"role": "user", "content": "Tell me about regions"}],
                "max_tokens": 128,
                "ignore_eos": True,  # every answer the same length: a queue behind one costs a whole answer
                "stream": True,
            }
            headers = {"Authorization": f"Bearer {self.token}", "x-session-id": uuid.uuid4().hex}
            sent = time.monotonic()
            try:
                with requests.post(
                    f"{self.gateway.url}/v1/chat/completions",
                    json=body,
                    headers=headers,
                    stream=True,
                    timeout=60,
                ) as reply:
                    complete = reply.status_code == 200 and any(
                        line == b"data: [DONE]" for line in reply.iter_lines()
                    )
                    status = reply.status_code if complete or reply.status_code != 200 else 599
                    self.answers.append((sent, status, reply.headers.get("x-model-version", "")))
            except requests.RequestException:
                self.answers.append((sent, 0, ""))

    def __enter__(self) -> "Clients":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=90)

    def failed(self) -> list[tuple[float, int, str]]:
        return [a for a in self.answers if a[1] != 200]
