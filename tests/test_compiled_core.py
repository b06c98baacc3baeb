"""The compiled core (services/compiled.py): loaded when `make` built it, pure Python when
`STARLING_PURE=1` or when the build cannot be used, and the core's unit tests pass both ways.

The rest of the suite runs against whatever `make` built; `test_core_unit_tests_pass_pure`
runs the codec, topic, channel and node-shell unit tests again as Python, in a child process
(seconds).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services import compiled

ROOT = Path(__file__).resolve().parent.parent
# The core's quick unit tests; the Hypothesis suites (test_codec_properties.py,
# tests/security/test_codec_fuzz.py) take a minute each way and run compiled only.
PURE_TOO = (
    "tests/common/test_codec_golden.py",
    "tests/common/test_topics.py",
    "tests/common/test_subscription.py",
    "tests/common/test_autosub.py",
    "tests/common/test_merge.py",
    "tests/bench/test_frames.py",
    # the node's shell around the channel
    "tests/connection/test_mesh.py",
    "tests/connection/test_route_copies.py",
    "tests/connection/test_routing.py",
    *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/connection/test_channel_*.py")),
)


def _run(code: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout + done.stderr


def _version(**env: str) -> str:
    return _run("from services.cli.main import main; main(['version'])", **env)


def _require_build() -> Path:
    if compiled.status().reason == f"{compiled.PURE_ENV}=1":
        pytest.skip(f"this run asked for pure Python ({compiled.PURE_ENV}=1)")
    where = compiled.build_dir()
    failed = where.with_name(where.name + ".failed")
    if not (where / compiled.MANIFEST).is_file() and not failed.is_file():
        pytest.skip(f"no compiled build in {where} (`make compiled` builds it)")
    return where


def test_the_compiled_modules_load_when_built() -> None:
    where = _require_build()
    status = compiled.status()
    assert status.compiled, f"the build in {where} is not used: {status.reason}"
    for name in compiled.COMPILED_MODULES:
        module = importlib.import_module(name)
        assert Path(str(module.__file__)).is_relative_to(where), name
    assert f"core: compiled (mypyc) from {where}" in _version()


def test_starling_pure_loads_the_python_modules() -> None:
    out = _run(
        "import importlib, services.compiled as c\n"
        "for n in c.COMPILED_MODULES: print(importlib.import_module(n).__file__)\n"
        "from services.cli.main import main; main(['version'])",
        STARLING_PURE="1",
    )
    files = [line for line in out.splitlines() if line.startswith("/")]
    assert len(files) == len(compiled.COMPILED_MODULES)
    assert all(f.endswith(".py") for f in files), files
    assert "core: pure Python (STARLING_PURE=1)" in out


def _fake_build(tmp_path: Path, **changes: object) -> Path:
    """A manifest as `make` writes it, for the sources as they are, then `changes`."""
    where = tmp_path / "compiled"
    where.mkdir()
    files = {"services/compiled.py": compiled.file_digest(ROOT / "services" / "compiled.py")}
    extensions = {m: f"lib/{m}.so" for m in (*compiled.COMPILED_MODULES, compiled.RUNTIME)}
    (where / "lib").mkdir()
    for rel in extensions.values():
        (where / rel).touch()
    manifest = {
        "python": compiled.python_tag(),
        "modules": list(compiled.COMPILED_MODULES),
        "files": files,
        "extensions": extensions,
        **changes,
    }
    (where / compiled.MANIFEST).write_text(json.dumps(manifest))
    return where


def test_a_build_is_used_only_when_it_matches_the_sources(tmp_path: Path) -> None:
    extensions, reason = compiled._check(_fake_build(tmp_path))
    assert reason == "" and len(extensions) == len(compiled.COMPILED_MODULES) + 1


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"files": {"services/compiled.py": "0" * 64}}, "stale build: services/compiled.py"),
        ({"modules": ["services.common.mqtt.decoder"]}, "list of compiled modules changed"),
        ({"python": "cpython-399 .so"}, "built for cpython-399"),
        ({"extensions": {}}, "incomplete build"),
        ({"extensions": {compiled.RUNTIME: "lib/gone.so"}}, "incomplete build"),
    ],
)
def test_a_stale_or_foreign_build_is_not_used(
    tmp_path: Path, changes: dict[str, object], reason: str
) -> None:
    extensions, why = compiled._check(_fake_build(tmp_path, **changes))
    assert extensions == {} and reason in why


def test_no_build_is_not_used(tmp_path: Path) -> None:
    assert "no compiled build" in compiled._check(tmp_path / "nowhere")[1]


def test_core_unit_tests_pass_pure() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *PURE_TOO],
        cwd=ROOT,
        env={**os.environ, "STARLING_PURE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
