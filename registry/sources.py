"""Where a version's weights may be read from: the operator's allow-list, ``ARTIFACT_SOURCES``.

Whoever registers a version names its artifact URI, and the platform reads it with its own network, files
and credentials: ingest streams it into the home store, and a region without an object store serves a
``file://`` directory straight from the host (or syncs it into a pod). Without a list a tenant could name
any file on those hosts, any bucket the platform's keys open, or any URL inside its network. The declared
SHA-256 keeps such bytes from being stored, but the read still happens, and whether the version is then
rejected tells the tenant whether its guess of the contents was right. So a URI must lie under one of the
operator's prefixes when it is registered, and again when it is read: the list may have narrowed since,
and a symlink under an allowed directory may point out of it (``check_readable`` follows them, and
``check_opened`` checks the file a reader actually opened).

A prefix matches whole path segments: ``file:///srv/models`` admits ``/srv/models/llama`` but not
``/srv/models-private``. ``s3://`` or ``https://`` alone admit every bucket or host, ``file://`` alone
every file (the operator's choice, documented as wide).

URLs are refused rather than interpreted where the readers' parsers could disagree with this one: a
backslash, a space or control character, a user name (``a@b``), or a dot segment (``..``, ``..;``, and
``.`` outside ``file://``, in any percent-spelling). Files are compared by their normalised path, object
keys and URL paths as written.
"""

import os
import posixpath
import re
from pathlib import Path
from typing import BinaryIO, NamedTuple
from urllib.parse import unquote, urlsplit

from django.conf import settings

from core.errors import ValidationFailed

SCHEMES = ("file", "s3", "gs", "http", "https")
# Read differently by urllib3 (a backslash ends the host) or by servers: refused, never interpreted.
AMBIGUOUS = re.compile(r"[\x00-\x20\x7f\\]")


class Location(NamedTuple):
    scheme: str
    authority: str  # host[:port] (an IPv6 host in brackets) or bucket, lower-cased; "" for file://
    path: str  # always starting with "/"; normalised for files only


def _location(uri: str) -> Location | None:
    """The URI's scheme, authority and path, or None when it is not one we read unambiguously."""
    if not isinstance(uri, str) or AMBIGUOUS.search(uri) or AMBIGUOUS.search(unquote(uri)):
        return None
    try:
        parts = urlsplit(uri)
        port = parts.port  # a malformed port raises here
    except ValueError:
        return None
    if parts.scheme not in SCHEMES or "@" in parts.netloc:
        return None
    segments = unquote(parts.path).split("/")  # a server decodes %2e%2e into "..": either spelling
    if any(s.startswith("..") or (s == "." and parts.scheme != "file") for s in segments):
        return None
    host = parts.hostname or ""
    authority = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
    path = parts.path or "/"
    return Location(parts.scheme, authority, posixpath.normpath(path) if parts.scheme == "file" else path)


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


def malformed_sources() -> list[str]:
    """Entries of the list that are no prefix at all (they would admit nothing, silently)."""
    relative = [p for p in allowed_sources() if p.startswith("file://") and p != "file://" and p[7:8] != "/"]
    return [p for p in allowed_sources() if _location(p) is None] + relative  # file://var/...: "var" a host


def _prefixes() -> list[Location]:
    """The allowed prefixes; a directory's also as its symlinks resolve, so that a resolved path matches."""
    found = [p for p in map(_location, allowed_sources()) if p is not None]
    return found + [p._replace(path=str(Path(p.path).resolve())) for p in found if p.scheme == "file"]


def _allowed(location: Location | None, prefixes: list[Location] | None = None) -> bool:
    if location is None:
        return False
    return any(_under(location, prefix) for prefix in (prefixes if prefixes is not None else _prefixes()))


def source_allowed(uri: str) -> bool:
    return _allowed(_location(uri))


def _refuse(field: str) -> ValidationFailed:
    accepted = ", ".join(allowed_sources()) or "nothing (ARTIFACT_SOURCES is empty)"
    return ValidationFailed(
        f"{field} is not under a source this platform reads weights from; it accepts: {accepted}.",
        detail={field: ["not an allowed artifact source"]},
    )


def check_source(uri: str, field: str = "artifact_uri") -> None:
    """Refuse a URI outside the allow-list, naming what the platform accepts."""
    if not source_allowed(uri):
        raise _refuse(field)


def _check_real_path(path: str, prefixes: list[Location] | None = None) -> None:
    if not _allowed(Location("file", "", posixpath.normpath(path)), prefixes):
        raise _refuse("artifact_uri")


def check_readable(uri: str) -> None:
    """At read time: the URI is still allowed and, for a file or a model directory, so is where each of
    its symlinks leads."""
    location, prefixes = _location(uri), _prefixes()  # the list read once for every file below
    if not _allowed(location, prefixes):
        raise _refuse("artifact_uri")
    if location is None or location.scheme != "file":
        return
    root = Path(location.path)
    _check_real_path(str(root.resolve()), prefixes)
    if root.is_dir():
        for folder, names, files in os.walk(root):  # links are checked, not followed into
            for name in names + files:
                _check_real_path(str((Path(folder) / name).resolve()), prefixes)


def check_opened(handle: BinaryIO, path: str) -> None:
    """The file a reader opened is still inside the list: a link swapped in after ``check_readable``
    (between the check and the open) is caught here, by what the descriptor really points at."""
    proc = Path(f"/proc/self/fd/{handle.fileno()}")
    _check_real_path(os.readlink(proc) if proc.exists() else str(Path(path).resolve()))
