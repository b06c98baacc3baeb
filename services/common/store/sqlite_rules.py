"""Embedded `RuleStore`: the tenants' rules in SQLite."""

from __future__ import annotations

from pathlib import Path

from services.common.store.ports_rules import RuleRecord
from services.common.store.sqlite_base import SqliteDb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rules (
  tenant TEXT NOT NULL, rule_id TEXT NOT NULL, sql TEXT NOT NULL, actions_json TEXT NOT NULL,
  enabled INTEGER NOT NULL, created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL,
  description TEXT NOT NULL, PRIMARY KEY (tenant, rule_id));
CREATE TABLE IF NOT EXISTS auto_subscriptions (
  tenant TEXT NOT NULL, filter TEXT NOT NULL, qos INTEGER NOT NULL, PRIMARY KEY (tenant, filter));
"""
_COLUMNS = "tenant, rule_id, sql, actions_json, enabled, created_at_ms, updated_at_ms, description"
_Row = tuple[str, str, str, str, int, int, int, str]


def _record(row: _Row) -> RuleRecord:
    t, rid, sql, actions, enabled, created, updated, desc = row
    return RuleRecord(t, rid, sql, actions, bool(enabled), created, updated, desc)


class SqliteRuleStore(SqliteDb):
    def __init__(self, path: Path) -> None:
        super().__init__(path, _SCHEMA)

    async def put_rule(self, r: RuleRecord) -> None:
        await self.run(
            lambda: self.db.execute(
                f"INSERT OR REPLACE INTO rules ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    r.tenant,
                    r.rule_id,
                    r.sql,
                    r.actions_json,
                    int(r.enabled),
                    r.created_at_ms,
                    r.updated_at_ms,
                    r.description,
                ),
            )
        )

    async def get_rule(self, tenant: str, rule_id: str) -> RuleRecord | None:
        row = await self.run(
            lambda: self.db.execute(
                f"SELECT {_COLUMNS} FROM rules WHERE tenant=? AND rule_id=?", (tenant, rule_id)
            ).fetchone()
        )
        return _record(row) if row else None

    async def list_rules(self, tenant: str | None = None) -> list[RuleRecord]:
        def q() -> list[_Row]:
            sql = f"SELECT {_COLUMNS} FROM rules"
            if tenant is None:
                return self.db.execute(f"{sql} ORDER BY tenant, rule_id").fetchall()
            return self.db.execute(f"{sql} WHERE tenant=? ORDER BY rule_id", (tenant,)).fetchall()

        return [_record(row) for row in await self.run(q)]

    async def delete_rule(self, tenant: str, rule_id: str) -> bool:
        cur = await self.run(
            lambda: self.db.execute(
                "DELETE FROM rules WHERE tenant=? AND rule_id=?", (tenant, rule_id)
            )
        )
        return cur.rowcount > 0

    async def put_auto_subscription(self, tenant: str, filter: str, qos: int) -> None:
        await self.run(
            lambda: self.db.execute(
                "INSERT OR REPLACE INTO auto_subscriptions (tenant, filter, qos) VALUES (?, ?, ?)",
                (tenant, filter, qos),
            )
        )

    async def delete_auto_subscription(self, tenant: str, filter: str) -> bool:
        cur = await self.run(
            lambda: self.db.execute(
                "DELETE FROM auto_subscriptions WHERE tenant=? AND filter=?", (tenant, filter)
            )
        )
        return cur.rowcount > 0

    async def list_auto_subscriptions(
        self, tenant: str | None = None
    ) -> list[tuple[str, str, int]]:
        def q() -> list[tuple[str, str, int]]:
            sql = "SELECT tenant, filter, qos FROM auto_subscriptions"
            if tenant is None:
                return self.db.execute(f"{sql} ORDER BY tenant, filter").fetchall()
            return self.db.execute(f"{sql} WHERE tenant=? ORDER BY filter", (tenant,)).fetchall()

        return [(t, f, q) for t, f, q in await self.run(q)]
