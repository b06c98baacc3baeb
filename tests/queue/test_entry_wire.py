"""The queue stores a received NewEntry, less its queue_id, as the QueueEntry it hands out
(services/queue/api.py `_new_item`), and reads merge seq, expiry and the released mark into
it: this holds only while the two messages keep fields 2 to 5 alike."""

from __future__ import annotations

from services.common.envelope import from_envelope, to_envelope
from services.common.message import Message
from services.common.mqtt.properties import Properties
from services.queue.api import _new_item
from services.queue.client import _entry_from_pb
from starling.queue.v1 import queue_pb2 as pb


def test_new_entry_and_queue_entry_share_fields_2_to_5() -> None:
    new = {f.number: f for f in pb.NewEntry.DESCRIPTOR.fields}
    stored = {f.number: f for f in pb.QueueEntry.DESCRIPTOR.fields}
    for n in (2, 3, 4, 5):
        a, b = new[n], stored[n]
        assert (a.name, a.type, a.is_repeated, a.is_packed, a.message_type) == (
            b.name,
            b.type,
            b.is_repeated,
            b.is_packed,
            b.message_type,
        )
    assert new[1].name == "queue_id" and stored[1].name == "seq"


def test_stored_entry_reads_back_as_the_message_with_its_queue_fields() -> None:
    msg = Message(
        "t",
        "a/b",
        b"payload",
        2,
        True,
        "pub",
        Properties(content_type="text/plain", user_property=(("k", "v"),)),
        expires_at=1_060.0,
        published_at=1_000.0,
    )
    env = to_envelope(msg, "node-0", "m-1")
    new = pb.NewEntry(
        queue_id="c#1", message=env, qos=1, retain=False, subscription_identifiers=[7, 9]
    )
    item = _new_item(new)
    assert new.queue_id == "c#1"  # the request is left as it came
    assert item.expires_at_ms == 1_060_000
    read = pb.ReadResponse()
    read.entries.add(seq=42, expires_at_ms=item.expires_at_ms, released=True).MergeFromString(
        item.data
    )
    entry = _entry_from_pb(pb.ReadResponse.FromString(read.SerializeToString()).entries[0])
    assert (entry.seq, entry.subscription_ids, entry.released) == (42, (7, 9), True)
    assert entry.message == from_envelope(env)._replace(qos=1, retain=False)
    assert entry.message.properties.content_type == "text/plain"
    assert entry.message.expires_at == 1_060.0
