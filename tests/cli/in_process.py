"""`starling ARGS` run in the test's own process: what a subprocess of the command would give
(exit status, stdout, stderr as a `CompletedProcess`) without starting a Python process and
importing the CLI again for every command (the suite runs hundreds).

Tests about the installed entry point itself keep a real process (`starling_process`); every
command family keeps at least one such test (tests/e2e/test_cli.py, tests/rules/test_cli.py,
tests/e2e/test_drain.py, tests/cli/up_process.py).

What differs from a process, and how it is made not to matter:
- the exit status: `main`'s return value, or the code of the `SystemExit` it raised (argparse
  errors: 2; a message instead of a code: printed to stderr, 1, as the interpreter does);
- the environment: `env` sets variables for the call (None removes one), restored after;
- the process-wide mesh secret a test may have installed (tests/inproc.py) would ride on the
  command's gRPC calls, which a real CLI never sends: it is taken off for the call;
- commands run `asyncio.run`, which cannot run inside a running event loop: called from one
  (an async test) the command runs in a thread of its own, and the caller's loop waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping

from services.cli.main import main
from services.common.rpc.credentials import (
    AUDITED_BY_KEY,
    MESH_METADATA_KEY,
    mesh_metadata,
    set_audited_by,
    set_mesh_secret,
)

STARLING = [sys.executable, "-m", "services.cli.main"]


def starling_process(
    *args: str, env: Mapping[str, str | None] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m services.cli.main ARGS` in a process of its own (the entry point itself)."""
    return subprocess.run(
        [*STARLING, *args],
        env=_environ(env or {}),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def starling_in_process(
    *args: str, env: Mapping[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`starling ARGS` run by `services.cli.main.main` here, its output captured."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(list(args), env or {})
    done: list[subprocess.CompletedProcess[str]] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            done.append(_run(list(args), env or {}))
        except BaseException as exc:  # raised again in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=work, name="starling-in-process")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return done[0]


def _run(argv: list[str], env: Mapping[str, str | None]) -> subprocess.CompletedProcess[str]:
    out, err = io.StringIO(), io.StringIO()
    with _environment(env), _no_mesh_secret():
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = _exit_status(exc, err)
    return subprocess.CompletedProcess(["starling", *argv], code, out.getvalue(), err.getvalue())


def _exit_status(exc: SystemExit, err: io.StringIO) -> int:
    """The status a process raising `exc` exits with (a message: printed, status 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return int(exc.code or 0)
    print(exc.code, file=err)
    return 1


def _environ(env: Mapping[str, str | None]) -> dict[str, str]:
    merged = {**os.environ, **env}
    return {k: v for k, v in merged.items() if v is not None}


@contextlib.contextmanager
def _environment(env: Mapping[str, str | None]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in env}
    _apply(env)
    try:
        yield
    finally:
        _apply(before)


def _apply(env: Mapping[str, str | None]) -> None:
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@contextlib.contextmanager
def _no_mesh_secret() -> Iterator[None]:
    sent = dict(mesh_metadata())
    set_audited_by("")
    set_mesh_secret("")
    try:
        yield
    finally:
        set_audited_by(sent.get(AUDITED_BY_KEY, ""))
        set_mesh_secret(sent.get(MESH_METADATA_KEY, ""))
