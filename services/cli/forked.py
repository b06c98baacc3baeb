"""The client of services/cli/forkserver.py: `spawn` asks a fork server for a service process
and returns a `Forked`, which a launcher holds as it would a `subprocess.Popen` (pid, poll,
wait, send_signal, terminate, kill, returncode). The connection stays open for the child's
life: the server writes its exit code on it, and kills the child when it closes (the launcher
died)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


class Forked:
    """A service process forked by the fork server, seen like a `subprocess.Popen`."""

    def __init__(self, *, conn: socket.socket, pid: int, args: list[str]) -> None:
        self._conn = conn
        self._buf = b""
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once the child ended, else None (never blocks)."""
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Until the child ends; `subprocess.TimeoutExpired` after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read(self, timeout: float | None) -> None:
        readable, _, _ = select.select([self._conn], [], [], timeout)
        if not readable:
            return
        data = self._conn.recv(4096)
        if not data:  # the server is gone: so is the child (it dies with the server)
            self._ended(-signal.SIGTERM)
            return
        self._buf += data
        for line in self._buf.split(b"\n")[:-1]:
            if line.startswith(b"exit "):
                self._ended(int(line[5:]))
        self._buf = self._buf.rsplit(b"\n", 1)[-1]

    def _ended(self, code: int) -> None:
        self.returncode = code
        self._conn.close()


def spawn(
    *, server: str, module: str, env: dict[str, str], cwd: str, log: Path, timeout_s: float = 10
) -> Forked:
    """Fork `python -m module` from the fork server listening on `server`."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout_s)
    conn.connect(server)
    request = {"module": module, "env": env, "cwd": cwd, "log": str(log)}
    conn.sendall(json.dumps(request).encode() + b"\n")
    line = b""
    while not line.endswith(b"\n"):  # a byte at a time: what follows is the child's exit
        chunk = conn.recv(1)
        if not chunk:
            raise RuntimeError(f"fork server {server} closed before starting {module}")
        line += chunk
    conn.settimeout(None)
    pid = int(line.split()[1])
    return Forked(conn=conn, pid=pid, args=[module])


def start_server(path: Path, timeout_s: float = 30) -> subprocess.Popen[bytes]:
    """Start a fork server on the Unix socket `path` (it dies with this process) and return
    once it accepts requests; name `path` in `STARLING_FORK_SERVER` for launchers to use it."""
    root = Path(__file__).resolve().parent.parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.forkserver", str(path)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the fork server exited with {proc.returncode}")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            return proc
        except OSError:
            time.sleep(0.05)
        finally:
            probe.close()
    proc.kill()
    raise RuntimeError(f"the fork server did not listen on {path} within {timeout_s:.0f}s")
