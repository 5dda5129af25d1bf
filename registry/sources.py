"""Where a version's weights may be read from: the operator's allow-list, ``ARTIFACT_SOURCES``.

Whoever registers a version names its artifact URI, and the platform reads it with its own network, files
and credentials: ingest streams it into the home store, and a region without an object store serves a
``file://`` directory straight from the host. Without a list a tenant could name any file on those hosts,
any bucket the platform's keys open, or any URL inside its network. The declared SHA-256 keeps such bytes
from being stored, but the read still happens, and whether the version is then rejected tells the tenant
whether its guess of the contents was right. So a URI must lie under one of the operator's prefixes when
it is registered, and again when it is read: the list may have narrowed since, and a symlink under an
allowed directory may point out of it (``check_readable`` follows it).

A prefix matches whole path segments: ``file:///srv/models`` admits ``/srv/models/llama`` but not
``/srv/models-private``. ``s3://`` or ``https://`` alone admit every bucket or host (the operator's
choice, documented as wide).
"""

import posixpath
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from django.conf import settings

from core.errors import ValidationFailed

SCHEMES = ("file", "s3", "gs", "http", "https")


class Location(NamedTuple):
    scheme: str
    authority: str  # host[:port] or bucket, lower-cased; "" for file://
    path: str  # normalised, always starting with "/"


def _location(uri: str) -> Location | None:
    """The URI's scheme, authority and normalised path, or None when it is not one we read."""
    try:
        parts = urlsplit(uri)
        port = parts.port  # a malformed port raises here
    except ValueError:
        return None
    path = parts.path or "/"
    decoded = unquote(path)  # a server decodes %2e%2e into "..": refused in either spelling
    if parts.scheme not in SCHEMES or "\x00" in unquote(uri) or ".." in decoded.split("/"):
        return None
    authority = (parts.hostname or "") + (f":{port}" if port else "")
    return Location(parts.scheme, authority, posixpath.normpath(path) if path != "/" else "/")


def _under(location: Location, prefix: Location) -> bool:
    if location.scheme != prefix.scheme:
        return False
    if not prefix.authority and prefix.path == "/" and prefix.scheme != "file":
        return True  # "s3://", "https://": every bucket or host
    if location.authority != prefix.authority:
        return False
    base = prefix.path.rstrip("/")
    return not base or location.path == base or location.path.startswith(base + "/")


def allowed_sources() -> tuple[str, ...]:
    return tuple(settings.ARTIFACT_SOURCES)


def _prefixes() -> list[Location]:
    """The allowed prefixes; a directory's also as its symlinks resolve, so that a resolved path matches."""
    found = [p for p in map(_location, allowed_sources()) if p is not None]
    return found + [p._replace(path=str(Path(p.path).resolve())) for p in found if p.scheme == "file"]


def source_allowed(uri: str) -> bool:
    location = _location(uri)
    return location is not None and any(_under(location, prefix) for prefix in _prefixes())


def check_source(uri: str, field: str = "artifact_uri") -> None:
    """Refuse a URI outside the allow-list, naming what the platform accepts."""
    if not source_allowed(uri):
        accepted = ", ".join(allowed_sources()) or "nothing (ARTIFACT_SOURCES is empty)"
        raise ValidationFailed(
            f"{field} is not under a source this platform reads weights from; it accepts: {accepted}.",
            detail={field: ["not an allowed artifact source"]},
        )


def check_readable(uri: str) -> None:
    """At read time: the URI is still allowed and, for a file, so is where its symlinks lead."""
    check_source(uri)
    location = _location(uri)
    if location is not None and location.scheme == "file":
        check_source(f"file://{Path(location.path).resolve()}")
