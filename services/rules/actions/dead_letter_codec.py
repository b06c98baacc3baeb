"""The stored form of dead letters: an output as JSON (bytes as base64) and back, and a
failed batch encoded once for either backend (`encode_batch`), each letter with the size it
counts against the rule's byte bound; a letter larger than the bound alone is not kept."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.common.clock import now_ms
from services.rules.actions.base import Output

if TYPE_CHECKING:
    from services.rules.actions.dead_letter_store import DeadLetterLimits

MAX_ERROR_CHARS = 2000  # of the last attempt's error, kept with each letter


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """One failed batch of a rule's action, ready to write."""

    tenant: str
    rule_id: str
    action: str
    error: str
    attempts: int
    failed_at_ms: int
    letters: tuple[tuple[str, int], ...]  # (encoded output, size) of each output kept
    dropped: int  # outputs larger than `max_bytes` on their own, not kept


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return {"$b64": base64.b64encode(bytes(value)).decode()}
    return str(value)  # a column of a type JSON lacks keeps its text rather than failing


def _json_hook(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and "$b64" in obj:
        return base64.b64decode(obj["$b64"])
    return obj


def encode_output(o: Output) -> str:
    """The stored form of an output (JSON; bytes as base64)."""
    return json.dumps(
        {
            "tenant": o.tenant,
            "rule_id": o.rule_id,
            "topic": o.topic,
            "columns": o.columns,
            "payload": base64.b64encode(o.payload).decode(),
            "qos": o.qos,
            "message_id": o.message_id,
            "published_at_ms": o.published_at_ms,
            "user_properties": [list(p) for p in o.user_properties],
            "clientid": o.clientid,
        },
        default=_json_default,
        separators=(",", ":"),
    )


def decode_output(text: str) -> Output:
    d = json.loads(text, object_hook=_json_hook)
    return Output(
        tenant=d["tenant"],
        rule_id=d["rule_id"],
        topic=d["topic"],
        columns=d["columns"],
        payload=base64.b64decode(d["payload"]),
        qos=d["qos"],
        message_id=d["message_id"],
        published_at_ms=d["published_at_ms"],
        user_properties=tuple((k, v) for k, v in d["user_properties"]),
        clientid=d.get("clientid", ""),
    )


def encode_batch(
    *,
    tenant: str,
    rule_id: str,
    action: str,
    outputs: Sequence[Output],
    error: str,
    attempts: int,
    limits: DeadLetterLimits,
) -> EncodedBatch:
    """`outputs` as letters failed now: each encoded, sized (its text and the error), and
    left out when it alone is larger than `limits.max_bytes`."""
    error = error[:MAX_ERROR_CHARS]
    kept: list[tuple[str, int]] = []
    dropped = 0
    for o in outputs:
        text = encode_output(o)
        size = len(text) + len(error)
        if size > limits.max_bytes:
            dropped += 1
        else:
            kept.append((text, size))
    return EncodedBatch(
        tenant=tenant,
        rule_id=rule_id,
        action=action,
        error=error,
        attempts=attempts,
        failed_at_ms=now_ms(),
        letters=tuple(kept),
        dropped=dropped,
    )
