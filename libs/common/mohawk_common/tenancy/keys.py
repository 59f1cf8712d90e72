"""API keys: `mk-` and 32 random bytes, URL-safe; only a key's SHA-256 is ever stored."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "mk-"
KEY_BYTES = 32
DISPLAY_CHARS = 8  # how much of a key `mohawk tenant ls` shows, to tell keys apart


def new_api_key() -> str:
    """A fresh API key; the caller shows it once and stores only `hash_api_key` of it."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def hash_api_key(api_key: str) -> str:
    """The SHA-256 of the key, hex: what Redis holds and what a presented key is looked up by."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def display_prefix(api_key: str) -> str:
    """The first characters of the key, enough to recognise it in a listing, never to use it."""
    return api_key[:DISPLAY_CHARS]
