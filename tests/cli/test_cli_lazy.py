"""The `starling` command stays cheap to start: a command imports what it needs when it runs,
so `starling version` and `--help` load no gRPC, NATS, Redis, launcher or Spark, and the
parser they see shows every command as the complete one does. Also the in-process runner
the suite runs most commands with (tests/cli/in_process.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from services.cli.main import ANALYTICS_HELP, build_parser
from tests.cli.in_process import starling_in_process, starling_process

# What no command that only prints or parses may import (each costs 0.1 s to 1 s of CPU).
HEAVY = (
    "grpc",
    "nats",
    "redis",
    "aiohttp",
    "opentelemetry",
    "pyspark",
    "pyarrow",
    "google.protobuf",
    "services.cli.launcher",
    "services.cli.admin",
    "services.cli.rules",
)
_PROBE = """
import json, sys
from services.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _imported(*argv: str) -> set[str]:
    """The modules a `starling ARGV` process had imported when it ended."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=60
    )
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_version_help_and_a_parse_error_import_nothing_heavy() -> None:
    for argv in (["version"], ["--help"], ["rules", "--help"], ["clients", "--token", "x"]):
        assert _heavy(_imported(*argv)) == [], argv


def test_status_without_a_mesh_imports_nothing_heavy() -> None:
    assert _heavy(_imported("status", "--data-dir", "/nonexistent/starling")) == []


def test_the_light_parser_shows_analytics_as_the_complete_one_does() -> None:
    """Outside `starling analytics` its jobs (their modules load Spark) are not registered:
    `starling --help` and the errors listing the commands read the same all the same. (In a
    process of its own: the complete parser imports Spark and Arrow.)"""
    probe = (
        "from services.cli.main import build_parser\n"
        "complete = build_parser().format_help()\n"
        "assert build_parser('version').format_help() == complete\n"
        "assert build_parser('analytics').format_help() == complete\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert ANALYTICS_HELP in build_parser("version").format_help()


def test_in_process_runs_give_what_a_process_gives() -> None:
    for argv in (["version"], ["nosuch"], ["status", "--data-dir", "/nonexistent/starling"]):
        width = {"COLUMNS": "80"}  # argparse wraps usage lines to the terminal's width
        here, there = starling_in_process(*argv, env=width), starling_process(*argv, env=width)
        assert (here.returncode, here.stdout) == (there.returncode, there.stdout), argv
        assert there.stderr.endswith(here.stderr), argv  # a process may log more first


def test_in_process_sets_and_restores_the_environment(tmp_path: object) -> None:
    os.environ["STARLING_ADMIN_TOKEN"] = "from-env"
    try:
        done = starling_in_process(
            "clients",
            "--session-addr",
            "127.0.0.1:1",
            "--token-file",
            "/nonexistent/token",
            env={"STARLING_ADMIN_TOKEN": None},
        )
        assert done.returncode == 2 and "cannot read --token-file" in done.stdout
        assert os.environ["STARLING_ADMIN_TOKEN"] == "from-env"
    finally:
        del os.environ["STARLING_ADMIN_TOKEN"]


async def test_in_process_runs_from_inside_a_running_event_loop() -> None:
    """`starling health` runs `asyncio.run`, which a running loop refuses: it gets a thread."""
    done = starling_in_process("health", "127.0.0.1:1", "--timeout-s", "0.5")
    assert (done.returncode, done.stdout) == (1, "UNREACHABLE\n")
