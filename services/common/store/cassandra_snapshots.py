"""The routing snapshots on Cassandra (`EventLog`'s snapshot half; a mixin of
cassandra_eventlog.py's CassandraEventLog).

route_snapshots ((scope), snapshot_id DESC): manifests, written last; route_snapshot_tenants
((snapshot_id), tenant) and route_snapshot_parts ((snapshot_id, tenant), part): a snapshot's
contents, written before its manifest, so a snapshot without its manifest is never read.
Parts are at most services/router/snapshot.py PART_BYTES (1 MiB) each, one per row.
"""

from __future__ import annotations

from services.common.clock import now_ms
from services.common.store.cassandra import CassandraBase
from services.common.store.eventlog import SnapshotManifest

KEEP_SNAPSHOTS = 2  # the one in force and the one before it (a reader may be loading it)
_SCOPE = "routes"


class CassandraSnapshots(CassandraBase):
    def prepare_snapshots(self) -> None:
        p = self._session.prepare
        self._snap_put = p(
            "INSERT INTO route_snapshots (scope, snapshot_id, checkpoint, created_ms) "
            "VALUES (?,?,?,?)"
        )
        self._snap_list = p("SELECT snapshot_id, checkpoint, created_ms FROM route_snapshots "
                            "WHERE scope=?")  # fmt: skip
        self._snap_del = p("DELETE FROM route_snapshots WHERE scope=? AND snapshot_id=?")
        self._snap_tenant_put = p(
            "INSERT INTO route_snapshot_tenants (snapshot_id, tenant, subscriptions, parts) "
            "VALUES (?,?,?,?)"
        )
        self._snap_tenants = p(
            "SELECT tenant, subscriptions, parts FROM route_snapshot_tenants WHERE snapshot_id=?"
        )
        self._snap_tenants_del = p("DELETE FROM route_snapshot_tenants WHERE snapshot_id=?")
        self._part_put = p(
            "INSERT INTO route_snapshot_parts (snapshot_id, tenant, part, data) VALUES (?,?,?,?)"
        )
        self._parts = p("SELECT data FROM route_snapshot_parts WHERE snapshot_id=? AND tenant=?")
        self._parts_del = p("DELETE FROM route_snapshot_parts WHERE snapshot_id=? AND tenant=?")

    async def put_snapshot(
        self, checkpoint: int, parts: dict[str, tuple[int, list[bytes]]]
    ) -> SnapshotManifest:
        created = now_ms()
        known = await self._exec(self._snap_list, (_SCOPE,))
        sid = max([created] + [r.snapshot_id + 1 for r in known])
        # Contents first, the manifest last: a snapshot without its manifest is never read.
        for tenant, (count, blobs) in parts.items():
            for i, blob in enumerate(blobs):
                await self._exec(self._part_put, (sid, tenant, i, blob))
            await self._exec(self._snap_tenant_put, (sid, tenant, count, len(blobs)))
        await self._exec(self._snap_put, (_SCOPE, sid, checkpoint, created))
        for old in sorted((r.snapshot_id for r in known), reverse=True)[KEEP_SNAPSHOTS - 1 :]:
            await self._exec(self._snap_del, (_SCOPE, old))
            for t in await self._exec(self._snap_tenants, (old,)):
                await self._exec(self._parts_del, (old, t.tenant))
            await self._exec(self._snap_tenants_del, (old,))
        tenants = {t: (n, len(b)) for t, (n, b) in parts.items()}
        return SnapshotManifest(sid, checkpoint, created, tenants)

    async def latest_snapshot(self) -> SnapshotManifest | None:
        rows = await self._exec(self._snap_list, (_SCOPE,))
        if not rows:
            return None
        top = max(rows, key=lambda r: r.snapshot_id)  # newest (at most KEEP_SNAPSHOTS + 1)
        tenants = {
            r.tenant: (int(r.subscriptions), int(r.parts))
            for r in await self._exec(self._snap_tenants, (top.snapshot_id,))
        }
        return SnapshotManifest(top.snapshot_id, top.checkpoint, top.created_ms, tenants)

    async def snapshot_parts(self, snapshot_id: int, tenant: str) -> list[bytes]:
        return [bytes(r.data) for r in await self._exec(self._parts, (snapshot_id, tenant))]
