"""The embedded broker (no Redis or RabbitMQ needed): kombu's filesystem transport, each message written
atomically. kombu writes a message file in place, so a worker polling the folder can take it before its
bytes are in: it reads an empty payload and dies on it (seen on the quick start's worker). Here a message
is written under a name the readers skip, then renamed: a rename within a folder is atomic."""

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"  # as kombu names it
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"  # readers take only names ending in "<queue>.msg"
        with open(partial, "wb") as message:
            message.write(str_to_bytes(dumps(payload)))
        os.replace(partial, final)


class Transport(filesystem.Transport):
    Channel = Channel
