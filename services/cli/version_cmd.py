"""`starling version`: the package version and which core runs (services/compiled.py)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from services.compiled import status


def add_version_command(sub: Any) -> None:
    sub.add_parser(
        "version", help="the version, and whether the compiled (mypyc) core or pure Python runs"
    )


def package_version() -> str:
    try:
        return version("starling")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def run_version() -> int:
    print(f"starling {package_version()}")
    print(f"core: {status().describe()}")
    return 0
