"""The topic of a client's connect and disconnect notices, as nodes and the gateway publish
them inside the client's tenant (EMQX's names): `$SYS/brokers/<node>/clients/<client id>/
<kind>`, with `/`, `+`, `#`, `%` and NUL of the ids percent-encoded so that each id stays one
topic level."""

from __future__ import annotations

_ESCAPES = str.maketrans({"%": "%25", "/": "%2F", "+": "%2B", "#": "%23", "\0": "%00"})


def client_event_topic(node_id: str, client_id: str, kind: str) -> str:
    """`$SYS/brokers/<node>/clients/<client id>/<kind>`, both ids percent-encoded."""
    node, client = node_id.translate(_ESCAPES), client_id.translate(_ESCAPES)
    return f"$SYS/brokers/{node}/clients/{client}/{kind}"
