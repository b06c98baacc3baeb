"""`starling store check`: an operator points it at a cluster and it runs the queue checks
and the store contract tests' Cassandra cases there (no server runs here: it must say what
failed against the address given, never pass or skip silently)."""

from __future__ import annotations

import subprocess
import sys

from services.cli.ports import free_port


def store_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", "store", "check", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_unreachable_cluster_fails_the_check_naming_it() -> None:
    where = f"127.0.0.1:{free_port()}"
    done = store_check("--cassandra", where, "--no-contracts")
    assert done.returncode == 1
    assert f"FAILED    queue store on {where}: NoHostAvailable" in done.stdout


def test_the_contract_tests_run_against_the_cluster_named() -> None:
    where = f"127.0.0.1:{free_port()}"
    done = store_check("--cassandra", where, "--keyspace", "starling_check_t")
    assert done.returncode == 1
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAILED    tests/")]
    # Every store's contract ran its Cassandra cases (none skipped, none of the SQLite ones).
    files = {line.split("::")[0].split("/")[-1] for line in failed}
    assert {"test_store_contract_queue.py", "test_store_contract_bans.py"} <= files
    assert all("[cassandra" in line for line in failed if "[" in line)
    assert "skipped   " not in done.stdout
    assert f"store check against {where} (keyspace starling_check_t" in done.stdout
