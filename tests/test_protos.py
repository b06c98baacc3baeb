"""The committed stubs under starling/ must match what `make protos` generates now."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.gen_protos import ROOT, generate


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    bindir = str(Path(os.sys.executable).parent)  # protoc plugins live beside the interpreter
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    generate(tmp_path)
    fresh = {
        p.relative_to(tmp_path): p.read_bytes()
        for p in (tmp_path / "starling").rglob("*")
        if p.is_file()
    }
    committed = {
        p.relative_to(ROOT): p.read_bytes()
        for p in (ROOT / "starling").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    stale = sorted(
        str(k) for k in fresh.keys() | committed.keys() if fresh.get(k) != committed.get(k)
    )
    if stale:
        pytest.fail(f"stale generated stubs, run `make protos`: {stale}")
