"""What a persistent route hands the queue service, shared by everyone who plans appends (the
router and the nodes' copies of the route table, services/common/route_table.py) and the
queue service's client: a queue's id, one entry for one queue (`NewEntry`) and what an
append did with it (`AppendResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from starling.common.v1.message_pb2 import RoutedMessage
from starling.queue.v1 import queue_pb2 as pb


def queue_id(client_id: str, incarnation: int) -> str:
    """A session incarnation's queue: a new session never reads an older one's entries."""
    return f"{client_id}#{incarnation}"


class AppendResult(IntEnum):
    """What an append did with one entry (values of `starling.queue.v1.AppendResult`)."""

    OK = pb.APPEND_RESULT_OK  # stored (or already stored: appends are idempotent)
    FENCED = pb.APPEND_RESULT_FENCED  # this queue's partition moved: not stored, try later
    QUEUE_FULL = pb.APPEND_RESULT_QUEUE_FULL  # the depth limit refused it: dropped for good
    # the tenant's max_queue_depth refused it: not stored, and the publisher is told (0x97)
    QUOTA_EXCEEDED = pb.APPEND_RESULT_QUOTA_EXCEEDED


@dataclass(frozen=True, slots=True)
class NewEntry:
    """One message for one queue, delivered at `qos` with `retain`."""

    queue_id: str
    message: RoutedMessage  # its message_id makes the append idempotent
    qos: int
    retain: bool
    subscription_ids: tuple[int, ...] = ()
