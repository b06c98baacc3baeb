"""The rule SQL's hashing and encoding functions: digests, CRC-32, base64, hex, and uuid."""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
import zlib
from collections.abc import Callable

from services.rules.sql.errors import EvalError
from services.rules.sql.values import raw_bytes, string


def digest(algo: str) -> Callable[[object], str]:
    """The hex digest of a string's UTF-8 with `algo` (md5, sha1, sha256)."""
    return lambda v: hashlib.new(algo, raw_bytes(v, algo)).hexdigest()


def crc32(v: object) -> int:
    return zlib.crc32(raw_bytes(v, "crc32"))


def b64encode(v: object) -> str:
    return base64.b64encode(raw_bytes(v, "base64_encode")).decode()


def b64decode(v: object) -> str:
    try:
        raw = base64.b64decode(string(v, "base64_decode"), validate=True)
    except (binascii.Error, ValueError):
        raise EvalError("base64_decode: not base64") from None
    return raw.decode("utf-8", "replace")


def hex_(v: object) -> str:
    if type(v) is int:
        return format(v, "x")
    return raw_bytes(v, "hex").hex()


def uuid4_text() -> str:
    return str(uuid.uuid4())
