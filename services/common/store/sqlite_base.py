"""Shared plumbing of the embedded SQLite stores: one connection, one worker thread, WAL."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

T = TypeVar("T")


# PRAGMA synchronous per `store_sync` value.
_SYNC = {"full": "FULL", "normal": "NORMAL"}
CHECKPOINT_EVERY_S = 0.5
WAL_SIZE_LIMIT_BYTES = 64 * 1024 * 1024


class SqliteDb:
    """Runs every statement on one worker thread so the event loop never waits on disk.

    WAL with synchronous=FULL (`sync="full"`, the default): a committed transaction survives
    a killed process and a power cut; `sync="normal"`: a killed process, not a power cut
    (the setting `store_sync`). busy_timeout lets several processes of one machine share a
    file.

    `background_checkpoint`: the WAL is copied back into the database by a thread of its own
    (`PRAGMA wal_checkpoint(PASSIVE)` every CHECKPOINT_EVERY_S) instead of by whichever
    commit crosses SQLite's 1,000-page mark. That commit would otherwise copy and fsync megabytes
    before its callers hear back: a latency spike on the message path every few seconds of
    load. A passive checkpoint never blocks a writer.
    """

    def __init__(
        self, path: Path, schema: str, sync: str = "full", background_checkpoint: bool = False
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._stop_checkpoints = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._together: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self.db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA busy_timeout=10000")
        # Several services open the same file at start; switching to WAL can report BUSY
        # without waiting on the busy handler, so retry the set-up for a while.
        for attempt in Retrying(
            stop=stop_after_delay(15),
            wait=wait_fixed(0.05),
            retry=retry_if_exception_type(sqlite3.OperationalError),
            reraise=True,
        ):
            with attempt:
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute(f"PRAGMA synchronous={_SYNC[sync]}")
                self.db.executescript(schema)
        if background_checkpoint:
            self.db.execute("PRAGMA wal_autocheckpoint=0")
            threading.Thread(
                target=self._checkpoint_now_and_then, name="sqlite-checkpoint", daemon=True
            ).start()

    def _checkpoint_now_and_then(self) -> None:
        db = sqlite3.connect(str(self._path), check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=1000")
            # After a complete checkpoint the next commit starts the WAL over; this caps the
            # file that a burst left behind.
            db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
            while not self._stop_checkpoints.wait(CHECKPOINT_EVERY_S):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:  # busy or closing: the next round tries again
                    continue
        finally:
            db.close()

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def run_together(self, fn: Callable[[], T]) -> T:
        """`run`, but the calls made in the same event-loop turn share one trip to the worker
        thread (one hand-over and one wake-up instead of one each: a reconnect storm makes
        hundreds of session reads at once). For short reads only: they run one after the
        other there, and an exception is its own call's."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._together.append((fn, done))
        if len(self._together) == 1:
            loop.call_soon(self._send_together)
        return await done

    def _send_together(self) -> None:
        calls, self._together = self._together, []

        def run_all() -> list[tuple[bool, object]]:
            out: list[tuple[bool, object]] = []
            for fn, _ in calls:
                try:
                    out.append((True, fn()))
                except Exception as exc:
                    out.append((False, exc))
            return out

        def settle(results: asyncio.Future[list[tuple[bool, object]]]) -> None:
            if results.cancelled() or results.exception() is not None:
                exc = results.exception() if not results.cancelled() else None
                for _, done in calls:
                    if not done.done():
                        done.set_exception(exc or RuntimeError("store worker stopped"))
                return
            for (_, done), (ok, value) in zip(calls, results.result(), strict=True):
                if done.done():  # its caller gave up
                    continue
                if ok:
                    done.set_result(value)
                else:
                    done.set_exception(value)  # type: ignore[arg-type]

        asyncio.get_running_loop().run_in_executor(self._pool, run_all).add_done_callback(settle)

    def tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in one IMMEDIATE transaction (takes the write lock up front)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            out = fn(self.db)
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return out

    async def close(self) -> None:
        self._stop_checkpoints.set()
        await self.run(self.db.close)
        self._pool.shutdown(wait=True)
