"""How large one gRPC message and one batch may be, for every client and server of the mesh.

Every gRPC channel and server of a process sets its max send and receive message length to
`max_message_bytes()`: the largest MQTT packet the mesh accepts (the shared setting
`max_packet_size_bytes`, set by `configure` when the process loads its settings) plus
`ENVELOPE_OVERHEAD_BYTES` for what travels beside the packet (message id, publisher identity,
queue id, subscription identifiers, trace context, protobuf framing). A message the
connection node accepted therefore always fits one call, alone.

Batches that cross a process stop growing at `BATCH_BYTES` (and their count limit): small
messages still share calls, and a message larger than the budget travels alone, so a call is
never larger than max(BATCH_BYTES, one message) plus overhead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

DEFAULT_MAX_PACKET_SIZE_BYTES = 16 << 20
# Beside the MQTT packet (whose topic, properties and payload bound the envelope's), an
# envelope carries ids and names of at most a few 64 KiB MQTT strings.
ENVELOPE_OVERHEAD_BYTES = 1 << 20
BATCH_BYTES = 1 << 20

_max_packet = DEFAULT_MAX_PACKET_SIZE_BYTES


def configure(max_packet_size_bytes: int) -> None:
    """This process's largest MQTT packet (from its settings): channels and servers made
    afterwards take their limits from it."""
    global _max_packet
    _max_packet = max_packet_size_bytes


def max_message_bytes() -> int:
    """The gRPC max send/receive message length of this process."""
    return _max_packet + ENVELOPE_OVERHEAD_BYTES


def grpc_options() -> list[tuple[str, int]]:
    n = max_message_bytes()
    return [("grpc.max_send_message_length", n), ("grpc.max_receive_message_length", n)]


def split_by_bytes(
    items: Iterable[T],
    size: Callable[[T], int],
    max_bytes: int = BATCH_BYTES,
    max_count: int = 0,
) -> list[list[T]]:
    """`items` cut, in order, into runs of at most `max_count` items (0: no count limit)
    whose sizes add up to at most `max_bytes`; an item larger than `max_bytes` alone makes a
    run, so every item goes somewhere and order is kept."""
    runs: list[list[T]] = []
    run: list[T] = []
    total = 0
    for item in items:
        n = size(item)
        if run and (total + n > max_bytes or (max_count and len(run) >= max_count)):
            runs.append(run)
            run, total = [], 0
        run.append(item)
        total += n
    if run:
        runs.append(run)
    return runs
