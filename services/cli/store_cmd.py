"""`starling store check --cassandra HOST:PORT`: check a live Cassandra cluster before
deploying on it, and print what was verified.

Two parts. The queue promises (services/common/store/cassandra_check.py: order, fencing of
an old owner, idempotent appends, drop) run with the real queue store on the cluster, on a
throw-away tenant and partitions no queue service uses; they ship with the image. Then, from
a source checkout with the dev extras (`pip install -e '.[dev]'`), the project's store
contract tests (tests/common/test_store_contract*.py, the ones CI runs on SQLite and on the
Cassandra simulation) run with pytest against the same cluster (`--no-contracts` skips
them). Both use their own keyspace (`--keyspace`; nothing drops it: name a throw-away one)
at the consistency given (`--consistency`, the mesh's LOCAL_QUORUM by default).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = "tests/common/test_store_contract*.py"
# The contract tests' Cassandra parameter (not the SQLite or simulated store ones).
CASSANDRA_CASES = "cassandra and not sqlite and not model and not simulated"


@dataclass(frozen=True, slots=True)
class CheckOptions:
    cassandra: str
    keyspace: str
    consistency: str
    verbose: bool
    contracts: bool = True


def add_store_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("store", help="check the store (Cassandra) the mesh will use")
    verbs = p.add_subparsers(dest="store_command", required=True)
    check = verbs.add_parser(
        "check", help="run the store contract tests against a live Cassandra cluster"
    )
    check.add_argument("--cassandra", required=True, metavar="HOST:PORT", help="a contact point")
    check.add_argument(
        "--keyspace", default="starling_check", help="keyspace the checks create and use"
    )
    check.add_argument(
        "--consistency", default="LOCAL_QUORUM", help="consistency of reads and writes"
    )
    check.add_argument("-v", "--verbose", action="store_true", help="pytest's own output")
    check.add_argument("--no-contracts", action="store_true", help="only the built-in queue checks")


def contract_files(root: Path = ROOT) -> list[Path]:
    return sorted(root.glob(CONTRACTS))


def pytest_command(files: list[Path], verbose: bool) -> list[str]:
    """pytest over the Cassandra cases of `files` (parameter id `cassandra`; not the SQLite
    or simulated ones), one line a test."""
    return [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
        "-rA", "-q" if not verbose else "-v", "-k", CASSANDRA_CASES,
        *map(str, files),
    ]  # fmt: skip


def summarize(output: str) -> tuple[list[str], list[str], list[str]]:
    """Passed, failed and skipped test ids from pytest's -rA short summary."""
    passed, failed, skipped = [], [], []
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word == "PASSED":
            passed.append(rest.strip())
        elif word in ("FAILED", "ERROR"):
            failed.append(rest.strip())
        elif word == "SKIPPED":
            skipped.append(rest.strip())
    return passed, failed, skipped


def queue_checks(opts: CheckOptions) -> bool:
    """The built-in queue checks on the cluster; True when every one held."""
    import asyncio

    from services.common.store.cassandra_check import check_queue_store
    from services.common.store.cassandra_queue import CassandraQueueStore

    host, _, port = opts.cassandra.partition(":")

    async def run() -> list[Any]:
        store = CassandraQueueStore(
            contact_points=[host],
            port=int(port or 9042),
            keyspace=opts.keyspace,
            consistency=opts.consistency,
        )
        try:
            return await check_queue_store(store)
        finally:
            await store.close()

    try:
        results = asyncio.run(run())
    except Exception as exc:  # no cluster there, refused keyspace, ...
        print(f"FAILED    queue store on {opts.cassandra}: {type(exc).__name__}: {exc}")
        return False
    for r in results:
        print(f"verified  queue: {r.name}" if r.ok else f"FAILED    queue: {r.name}: {r.detail}")
    return all(r.ok for r in results)


def run_check(opts: CheckOptions) -> int:
    ok = queue_checks(opts)
    if not opts.contracts:
        return 0 if ok else 1
    code = run_contracts(opts)
    return code if ok else max(code, 1)


def run_contracts(opts: CheckOptions) -> int:
    files = contract_files()
    if not files:
        print(
            f"starling store check: no contract tests under {ROOT}/tests; run it from a "
            "source checkout with `pip install -e '.[dev]'`"
        )
        return 2
    env = {
        **os.environ,
        "STARLING_TEST_CASSANDRA": opts.cassandra,
        "STARLING_TEST_CASSANDRA_KEYSPACE": opts.keyspace,
        "STARLING_TEST_CASSANDRA_CONSISTENCY": opts.consistency,
    }
    done = subprocess.run(
        pytest_command(files, opts.verbose), cwd=ROOT, env=env, capture_output=True, text=True
    )
    if opts.verbose:
        print(done.stdout + done.stderr)
    passed, failed, skipped = summarize(done.stdout)
    for test in passed:
        print(f"verified  {test}")
    for test in failed:
        print(f"FAILED    {test}")
    for test in skipped:
        print(f"skipped   {test}")
    print(
        f"store check against {opts.cassandra} (keyspace {opts.keyspace}, {opts.consistency}): "
        f"{len(passed)} verified, {len(failed)} failed, {len(skipped)} skipped"
    )
    if not passed and not failed:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        print("\n".join(tail))
        return 2
    return 0 if not failed and not skipped else 1
