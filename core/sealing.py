"""Sealing tenants' secrets for storage: AES-256-GCM under a key derived from ``TENANT_SECRETS_KEY``.

Rotating that key without losing a secret: the old key moves to ``TENANT_SECRETS_KEY_FALLBACKS`` (as
Django's ``SECRET_KEY_FALLBACKS``), values sealed under it still open, ``manage.py reseal_secrets`` seals
every stored value again under the new key, and then the fallback can go.

A sealed value is bound to what it belongs to (``context``, e.g. the tenant and the secret's name), so a
sealed blob copied to another row does not open there. The stored form is the 12-byte nonce followed by
the ciphertext and its tag; nothing of the value is stored in the clear, not even a hash of it (a short
secret's hash could be guessed offline).
"""

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.utils.crypto import salted_hmac

NONCE_BYTES = 12


class Unreadable(Exception):
    """The sealed value does not open: under none of the keys (``TENANT_SECRETS_KEY`` changed and the old
    one is not among the fallbacks), or in another context."""


def _cipher(secret: str) -> AESGCM:
    return AESGCM(salted_hmac("core.sealing", "tenant-secrets", secret=secret, algorithm="sha256").digest())


def sealing_key_tag() -> str:
    """Names the sealing key (its generation) without giving it away: 8 hex characters of an HMAC."""
    tag = salted_hmac("core.sealing", "key-tag", secret=settings.TENANT_SECRETS_KEY, algorithm="sha256")
    return tag.hexdigest()[:8]


def seal(value: str, context: str) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + _cipher(settings.TENANT_SECRETS_KEY).encrypt(nonce, value.encode(), context.encode())


def unseal(sealed: bytes, context: str) -> str:
    """The value, opened under the current key or, failing that, a fallback."""
    return unseal_with(sealed, context)[0]


def unseal_with(sealed: bytes, context: str) -> tuple[str, bool]:
    """The value, and whether it opened under the current key (False: a fallback's, due for resealing)."""
    keys = [settings.TENANT_SECRETS_KEY, *settings.TENANT_SECRETS_KEY_FALLBACKS]
    for index, key in enumerate(keys):
        try:
            nonce, body = sealed[:NONCE_BYTES], sealed[NONCE_BYTES:]
            return _cipher(key).decrypt(nonce, body, context.encode()).decode(), index == 0
        except (InvalidTag, ValueError):
            continue
    raise Unreadable(context)
