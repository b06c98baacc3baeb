"""Cassandra `RuleStore`: one partition per tenant, one row per rule (a tenant's rules are
read together); listing every tenant scans the table, which a rules instance does at start
(a few rows per tenant: docs/storage.md, "rules").

Only plain writes, never a lightweight transaction: a rule deleted then set again must come
out set, and Cassandra orders a plain write and an LWT on one row by different clocks. A
delete reads the row (LOCAL_QUORUM) to say whether it was there, then deletes it."""

from __future__ import annotations

from services.common.store.cassandra import CassandraBase
from services.common.store.cassandra_schema import Migration
from services.common.store.ports_rules import RuleRecord

_COLUMNS = "tenant, rule_id, sql, actions_json, enabled, created_at_ms, updated_at_ms, description"

MIGRATIONS = [
    Migration(
        1,
        "rules",
        (
            """CREATE TABLE IF NOT EXISTS rules (
             tenant text, rule_id text, sql text, actions_json text, enabled boolean,
             created_at_ms bigint, updated_at_ms bigint, description text,
             PRIMARY KEY ((tenant), rule_id))""",
        ),
    ),
    Migration(
        2,
        "auto subscriptions",
        (
            """CREATE TABLE IF NOT EXISTS auto_subscriptions (
             tenant text, filter text, qos int, PRIMARY KEY ((tenant), filter))""",
        ),
    ),
]


class CassandraRuleStore(CassandraBase):
    component = "rules"
    migrations = MIGRATIONS

    def prepare(self) -> None:
        p = self._session.prepare
        self._put = p(f"INSERT INTO rules ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
        self._get = p(f"SELECT {_COLUMNS} FROM rules WHERE tenant=? AND rule_id=?")
        self._of = p(f"SELECT {_COLUMNS} FROM rules WHERE tenant=?")
        self._all = p(f"SELECT {_COLUMNS} FROM rules")
        self._del = p("DELETE FROM rules WHERE tenant=? AND rule_id=?")
        self._put_auto = p("INSERT INTO auto_subscriptions (tenant, filter, qos) VALUES (?, ?, ?)")
        self._del_auto = p("DELETE FROM auto_subscriptions WHERE tenant=? AND filter=?")
        self._get_auto = p("SELECT qos FROM auto_subscriptions WHERE tenant=? AND filter=?")
        self._auto_of = p("SELECT tenant, filter, qos FROM auto_subscriptions WHERE tenant=?")
        self._auto_all = p("SELECT tenant, filter, qos FROM auto_subscriptions")

    async def put_rule(self, r: RuleRecord) -> None:
        await self._exec(
            self._put,
            (
                r.tenant,
                r.rule_id,
                r.sql,
                r.actions_json,
                r.enabled,
                r.created_at_ms,
                r.updated_at_ms,
                r.description,
            ),
        )

    async def get_rule(self, tenant: str, rule_id: str) -> RuleRecord | None:
        rows = list(await self._exec(self._get, (tenant, rule_id)))
        return _record(rows[0]) if rows else None

    async def list_rules(self, tenant: str | None = None) -> list[RuleRecord]:
        if tenant is None:
            rows = [_record(r) for r in await self._exec(self._all)]
        else:
            rows = [_record(r) for r in await self._exec(self._of, (tenant,))]
        return sorted(rows, key=lambda r: (r.tenant, r.rule_id))

    async def delete_rule(self, tenant: str, rule_id: str) -> bool:
        if not await self._exec(self._get, (tenant, rule_id)):
            return False
        await self._exec(self._del, (tenant, rule_id))
        return True

    async def put_auto_subscription(self, tenant: str, filter: str, qos: int) -> None:
        await self._exec(self._put_auto, (tenant, filter, qos))

    async def delete_auto_subscription(self, tenant: str, filter: str) -> bool:
        if not await self._exec(self._get_auto, (tenant, filter)):
            return False
        await self._exec(self._del_auto, (tenant, filter))
        return True

    async def list_auto_subscriptions(
        self, tenant: str | None = None
    ) -> list[tuple[str, str, int]]:
        if tenant is None:
            rows = await self._exec(self._auto_all)
        else:
            rows = await self._exec(self._auto_of, (tenant,))
        return sorted((r.tenant, r.filter, r.qos) for r in rows)


def _record(row: object) -> RuleRecord:
    return RuleRecord(
        tenant=row.tenant,  # type: ignore[attr-defined]
        rule_id=row.rule_id,  # type: ignore[attr-defined]
        sql=row.sql,  # type: ignore[attr-defined]
        actions_json=row.actions_json or "[]",  # type: ignore[attr-defined]
        enabled=bool(row.enabled),  # type: ignore[attr-defined]
        created_at_ms=row.created_at_ms or 0,  # type: ignore[attr-defined]
        updated_at_ms=row.updated_at_ms or 0,  # type: ignore[attr-defined]
        description=row.description or "",  # type: ignore[attr-defined]
    )
