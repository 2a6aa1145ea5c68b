"""API keys: high-entropy random strings, stored only as their SHA-256 digest.

A key is ``ppr_`` followed by 32 random bytes (URL-safe base64), so a plain, unsalted SHA-256
is the right storage: nobody can brute-force 256 bits, and a lookup by digest is exact and
needs no constant-time comparison. The first :data:`PREFIX_LENGTH` characters are kept in
clear text so an operator can tell keys apart.
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "ppr_"
PREFIX_LENGTH = 12


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_api_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def key_prefix(api_key: str) -> str:
    return api_key[:PREFIX_LENGTH]
