"""`starling analytics JOB ...` run in the test process on the shared SparkSession: the same
parser and runner as the command (analytics/cli.py), without a JVM of its own. One test runs
the command in a process of its own (tests/cli/test_analytics_cli.py)."""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import TYPE_CHECKING

import pytest

from analytics.cli import add_analytics_command, run_analytics

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_command(spark: SparkSession, argv: list[str], env: dict[str, str] | None = None) -> str:
    """Run `starling analytics ARGV` (with `env` set meanwhile) on `spark`; what it printed.
    A failure (exit status other than 0) fails the test."""
    parser = argparse.ArgumentParser(prog="starling")
    add_analytics_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analytics", *argv])
    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        for name, value in (env or {}).items():
            mp.setenv(name, value)
        assert run_analytics(args, spark) == 0
    return printed.getvalue()
