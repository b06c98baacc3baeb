"""Replies of the admin clients as JSON: dataclasses and named tuples become objects with their
field names, bytes base64, enums their names; None fields are left out, and message
properties show only those that are set."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable
from enum import Enum

from services.common.mqtt.properties import Properties


def jsonable(value: object) -> object:
    if isinstance(value, Properties):
        return {spec.name: jsonable(v) for spec, v in value.present()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _mapping((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (Message)
        return _mapping(zip(value._fields, value, strict=True))
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return _mapping(value.items())
    return value


def _mapping(items: Iterable[tuple[object, object]]) -> dict[str, object]:
    return {str(k): jsonable(v) for k, v in items if v is not None}


def to_json(value: object) -> str:
    return json.dumps(jsonable(value), indent=2)
