"""Group commit for an embedded SQLite store: the writes of concurrent callers share one
transaction, so one fsync (synchronous=FULL) covers all of them.

A caller hands `run` a function of the connection; it waits in a list until the store's
worker thread takes the whole list, runs each function inside its own SAVEPOINT of one
IMMEDIATE transaction, commits, and only then answers every caller. Writes that arrive while
a commit is in progress go together into the next one, so a burst of N concurrent writes
costs about two commits instead of N, and a lone write costs what a plain transaction did.

A function that raises rolls back to its savepoint only: the others still commit. A failed
BEGIN or COMMIT fails every caller of that turn, and none of their writes stays.

A write may say it needs no fsync of its own (`durable=False`: a queue ack, whose loss on a
power cut only means a redelivery the protocol allows). A turn made only of such writes
commits with synchronous=NORMAL: it survives a killed process, and the next durable commit's
fsync of the WAL covers it too. Acks then never hold a publisher's append behind an fsync.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

_Op = tuple[Callable[[sqlite3.Connection], Any], "asyncio.Future[Any]", bool]


class GroupCommit:
    def __init__(
        self, db: sqlite3.Connection, worker: Executor, max_ops: int = 512, fsync: bool = True
    ) -> None:
        """`worker` must be the store's single worker thread (the one that owns `db`);
        `max_ops` bounds the functions of one transaction (the rest go in the next);
        `fsync`: the connection runs with synchronous=FULL (else NORMAL, nothing to relax)."""
        self._db = db
        self._fsync = fsync
        self._worker = worker
        self._max_ops = max_ops
        self._lock = threading.Lock()  # the list is filled on the loop, emptied on the worker
        self._pending: list[_Op] = []
        self._queued = False  # a turn of the worker is already scheduled
        self.commits = 0  # transactions committed (for tests and benchmarks)

    async def run(self, fn: Callable[[sqlite3.Connection], T], durable: bool = True) -> T:
        """`fn(db)` inside a group transaction; returns once that transaction committed
        (`durable=False`: committed, maybe not yet fsynced)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        with self._lock:
            self._pending.append((fn, fut, durable))
            start = not self._queued
            self._queued = True
        if start:
            self._worker.submit(self._turn, loop)
        return await fut

    def _take(self) -> list[_Op]:
        with self._lock:
            batch, self._pending = self._pending[: self._max_ops], self._pending[self._max_ops :]
            self._queued = bool(self._pending)
        return batch

    def _turn(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._take()
        if self._queued:  # more than max_ops were waiting: another turn after this one
            self._worker.submit(self._turn, loop)
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        db = self._db
        relaxed = self._fsync and not any(durable for _, _, durable in batch)
        try:
            if relaxed:
                db.execute("PRAGMA synchronous=NORMAL")
            db.execute("BEGIN IMMEDIATE")
            for fn, fut, _ in batch:
                db.execute("SAVEPOINT op")
                try:
                    out = fn(db)
                except Exception as exc:  # this caller's writes only are undone
                    db.execute("ROLLBACK TO op")
                    db.execute("RELEASE op")
                    outcomes.append((fut, None, exc))
                    continue
                db.execute("RELEASE op")
                outcomes.append((fut, out, None))
            db.execute("COMMIT")
            self.commits += 1
        except Exception as exc:  # BEGIN or COMMIT failed: nothing of this turn stays
            if db.in_transaction:
                db.execute("ROLLBACK")
            outcomes = [(fut, None, exc) for _, fut, _ in batch]
        finally:
            if relaxed:
                db.execute("PRAGMA synchronous=FULL")
        loop.call_soon_threadsafe(_settle, outcomes)


def _settle(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, out, exc in outcomes:
        if fut.done():  # the caller was cancelled; its write committed all the same
            continue
        if exc is None:
            fut.set_result(out)
        else:
            fut.set_exception(exc)
