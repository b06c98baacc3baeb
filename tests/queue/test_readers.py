"""Push leases of queue readers (services/queue/readers.py)."""

from __future__ import annotations

from services.queue.readers import DETACHED_KEPT, MAX_CREDIT, Readers


def test_a_read_that_ends_after_its_readers_detach_does_not_take_the_lease_again() -> None:
    """The node closes a connection (detach) while that connection's last Read is still in
    the store: when the Read ends, the gone reader must not become the queue's pushee, else
    the next appends are marked delivered to nobody and reach the session's next connection
    with DUP=1."""
    r = Readers()
    r.read("t", "q", "old", through=3, at_end=True, room=10)
    assert r.get("t", "q") is not None
    r.detach("t", "q", "old")
    r.read("t", "q", "old", through=3, at_end=True, room=10)  # the late Read
    assert r.get("t", "q") is None and r.push("t", "q", 1) is None
    r.read("t", "q", "new", through=3, at_end=True, room=10)  # the next connection
    lease = r.push("t", "q", 1)
    assert lease is not None and lease.reader == "new"


def test_detached_readers_are_remembered_within_a_bound() -> None:
    r = Readers()
    for i in range(DETACHED_KEPT + 5):
        r.detach("t", f"q{i}", f"reader-{i}")
    assert len(r._detached) == DETACHED_KEPT
    r.read("t", "q0", "reader-0", through=1, at_end=True, room=1)  # forgotten: may lease
    assert r.get("t", "q0") is not None


def test_a_new_lease_starts_at_the_mark_before_the_read_that_took_it() -> None:
    """A new connection reads 1..5 (an earlier one was handed 1..3) but sends only 1 (the
    rest waits, e.g. for a packet id): reading 2..5 again, 4 and 5 are still first attempts;
    2 and 3 may have reached the earlier connection."""
    r = Readers()
    r.read("t", "q", "new", through=5, at_end=True, room=10, mark=3)
    assert r.delivered_before("t", "q", "new", durable=5) == 3
    assert r.delivered_before("t", "q", "other", durable=5) == 5


def test_a_renewal_counts_pushes_the_reader_had_not_received_and_appends_under_way() -> None:
    r = Readers()
    r.read("t", "q", "R", through=10, at_end=True, room=5)
    lease = r.push("t", "q", 2)
    assert lease is not None
    r.pushed(lease, 2, 12)  # seqs 11 and 12 went to R
    under_way = r.push("t", "q", 1)  # an append whose seq is not known yet
    assert under_way is lease
    r.renew("t", "q", "R", room=6, seen_through=11)  # 12 and the one under way: 2 unseen
    assert lease.credit == 4
    r.pushed(lease, 1, 13)
    r.renew("t", "q", "R", room=6, seen_through=13)
    assert lease.credit == 6
    r.renew("t", "q", "R", room=1, seen_through=10)  # never below zero
    assert lease.credit == 0


def test_a_read_counts_the_pushes_made_while_it_was_under_way() -> None:
    """Entries pushed during a read, past what it scanned, are on their way to the reader:
    the read's room, less those, is what may still be pushed."""
    r = Readers()
    r.read("t", "q", "R", through=10, at_end=True, room=5)
    lease = r.push("t", "q", 2)
    assert lease is not None
    r.pushed(lease, 2, 12)
    r.read("t", "q", "R", through=10, at_end=True, room=5)  # scanned before 11 and 12 came
    assert lease.credit == 3
    r.renew("t", "q", "R", room=10**9, seen_through=12)  # never more than a read may ask
    assert lease.credit == MAX_CREDIT
