"""The embedded broker writes each message atomically: a worker polling the folder never takes a message
whose bytes are not all in (kombu's own transport writes in place: a worker read an empty one and died)."""

import os
from queue import Empty

import pytest
from kombu import Connection

from controlplane.broker import Transport


@pytest.fixture
def channel(tmp_path):  # type: ignore[no-untyped-def]
    folders = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path), "store_processed": False}
    with Connection("filesystem://localhost//", transport=Transport, transport_options=folders) as connection:
        yield connection.default_channel


def test_a_message_is_invisible_to_readers_until_it_is_whole(channel, tmp_path, monkeypatch):
    seen_before_rename = []
    rename = os.replace

    def look_then_rename(source: str, target: str) -> None:
        with pytest.raises(Empty):  # the bytes are written, under a name no reader takes
            channel._get("celery")
        seen_before_rename.append(sorted(os.listdir(tmp_path)))
        rename(source, target)

    monkeypatch.setattr(os, "replace", look_then_rename)
    channel._put("celery", {"body": "x" * 100_000})
    (names,) = seen_before_rename
    assert len(names) == 1 and names[0].endswith(".celery.msg.part")
    assert channel._get("celery") == {"body": "x" * 100_000}
    assert os.listdir(tmp_path) == []
