"""Keyspace replication and versioned schema migrations of the Cassandra stores (pure logic;
services/common/store/cassandra.py runs it against the driver).

Replication comes from the `cassandra_replication` setting: `SimpleStrategy:N` (development,
one data centre) or `dc1:3,dc2:3` (NetworkTopologyStrategy, a replica count per data centre).

Migrations: each store (component) has an ordered list, version 1 upwards without gaps; the
keyspace's `schema_version` table holds the version each component reached. At start an
instance takes the component's migration lease (a lightweight transaction on its
`schema_lock` row, with a TTL so a crashed holder does not block forever), applies the
pending migrations in order and advances the version row with a compare-and-set after each;
instances that do not get the lease wait until the version reaches theirs. Every step is also
idempotent on its own (CREATE ... IF NOT EXISTS, a column added only if missing), so a
migration interrupted half-way is simply run again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

_DC = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_REPLICAS = 15  # per data centre; more is a typo, not a deployment


def parse_replication(value: str) -> dict[str, str | int]:
    """`SimpleStrategy:N` or `dc1:N,dc2:M` as the keyspace's replication map; ValueError
    saying what is wrong otherwise."""
    parts = [p.strip() for p in value.split(",")]
    if not value.strip() or any(not p for p in parts):
        raise ValueError("expected 'SimpleStrategy:N' or 'dc1:N,dc2:M'")
    pairs: list[tuple[str, int]] = []
    for part in parts:
        name, sep, count = part.partition(":")
        name = name.strip()
        if not sep or not count.strip().isdigit():
            raise ValueError(f"{part!r}: expected <name>:<replicas>")
        n = int(count)
        if not 1 <= n <= MAX_REPLICAS:
            raise ValueError(f"{part!r}: replicas must be 1..{MAX_REPLICAS}")
        pairs.append((name, n))
    if pairs[0][0] == "SimpleStrategy":
        if len(pairs) != 1:
            raise ValueError("SimpleStrategy takes one replica count and no data centres")
        return {"class": "SimpleStrategy", "replication_factor": pairs[0][1]}
    out: dict[str, str | int] = {"class": "NetworkTopologyStrategy"}
    for name, n in pairs:
        if not _DC.match(name) or name == "SimpleStrategy":
            raise ValueError(f"{name!r} is not a data centre name")
        if name in out:
            raise ValueError(f"data centre {name!r} named twice")
        out[name] = n
    return out


def replication_cql(replication: dict[str, str | int]) -> str:
    """The map as CQL (`{'class': 'SimpleStrategy', 'replication_factor': 1}`)."""
    return "{" + ", ".join(f"'{k}': '{v}'" for k, v in replication.items()) + "}"


def same_replication(a: dict[str, str | int], b: dict[str, str]) -> bool:
    """Whether the configured map `a` is what the keyspace has (`b` from system_schema, all
    values strings, the class possibly fully qualified)."""

    def norm(m: dict[str, str | int] | dict[str, str]) -> dict[str, str]:
        out = {k: str(v) for k, v in m.items()}
        out["class"] = out.get("class", "").rsplit(".", 1)[-1]
        return out

    return norm(a) == norm(b)


@dataclass(frozen=True)
class AddColumn:
    """ALTER TABLE ... ADD, skipped when the column exists (ALTER ADD is not idempotent)."""

    table: str
    column: str
    cql_type: str


Step = str | AddColumn  # a CQL statement that is idempotent by itself, or an AddColumn


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    steps: tuple[Step, ...]


def check_migrations(migrations: Sequence[Migration]) -> None:
    """Versions 1, 2, 3, ... in order: a gap or a repeat is a programming error."""
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise ValueError(f"migration {m.description!r} has version {m.version}, expected {i}")


def pending(migrations: Sequence[Migration], current: int) -> list[Migration]:
    """The migrations after version `current`, in order."""
    check_migrations(migrations)
    return [m for m in migrations if m.version > current]


class Ledger(Protocol):
    """Where a component's schema version and migration lease live (Cassandra tables)."""

    def version(self) -> int: ...

    def try_lease(self) -> bool: ...

    def release_lease(self) -> None: ...

    def advance(self, from_version: int, to_version: int) -> bool: ...

    def run(self, step: Step) -> None: ...

    def wait(self) -> None: ...


def migrate(ledger: Ledger, migrations: Sequence[Migration], max_waits: int) -> int:
    """Bring the component to the last migration's version; returns it. With the lease the
    pending migrations run in order, the version advancing (compare-and-set) after each;
    without it, wait for whoever holds it (at most `max_waits` waits)."""
    target = len(migrations)
    check_migrations(migrations)
    for _ in range(max_waits + 1):
        current = ledger.version()
        if current >= target:
            return current
        if ledger.try_lease():
            try:
                current = ledger.version()  # someone may have finished just before us
                for m in pending(migrations, current):
                    for step in m.steps:
                        ledger.run(step)
                    # Refused only if the lease ran out and another instance applied it too
                    # (the steps are idempotent): fine as long as the version got there.
                    if not ledger.advance(m.version - 1, m.version) and (
                        ledger.version() < m.version
                    ):
                        raise RuntimeError(f"schema version did not reach {m.version}")
                return max(current, target)
            finally:
                ledger.release_lease()
        ledger.wait()
    raise RuntimeError(
        f"schema migration lease held elsewhere; version still {ledger.version()} < {target}"
    )
