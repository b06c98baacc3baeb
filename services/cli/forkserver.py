"""`python -m services.cli.forkserver SOCKET`: a process that has imported every service once
and forks a service process on request, so a local mesh starts without paying each
service's imports (about 0.8 s of CPU a process here) again and again. Test suites start one
and name it in `STARLING_FORK_SERVER`; `starling up` spawns its children fresh without it.

Protocol, one Unix-socket connection per child (services/cli/forked.py is the client): the
client sends one JSON line `{"module", "env", "cwd", "log"}`; the server forks a child that
runs `python -m module` with exactly that environment and working directory, its output
appended to `log`, in a session of its own, and answers `pid N`. When the child ends the
server sends `exit CODE` (a negative code: killed by that signal, as `subprocess` reports it)
and closes the connection. When the client's end closes first (its process died), the child
gets SIGTERM, as a child of the launcher would from PR_SET_PDEATHSIG; and every child gets
SIGTERM when the server itself dies.

The server holds no thread, event loop, channel or connection when it forks: only imported
modules, which is what makes a fork of it as good as a fresh interpreter.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback

PRELOAD = tuple(
    f"services.{s}.main"
    for s in (
        "connection",
        "session",
        "router",
        "queue",
        "rules",
        "quota",
        "metrics",
        "console",
        "gateway",
    )
)
PR_SET_PDEATHSIG = 1
MAX_REQUEST = 1 << 20  # bytes of one request line (the environment is most of it)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _run_child(request: dict[str, object], keep_fds: list[int], server_pid: int) -> None:
    """In the forked child: become `python -m module` and never return."""
    code = 1
    try:
        for fd in keep_fds:
            os.close(fd)
        os.setsid()
        _die_with_parent()
        if os.getppid() != server_pid:  # the server died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)
        # The signal dispositions a fresh interpreter starts with (SIGPIPE ignored, so a
        # write to a closed socket raises instead of killing the process).
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.set_wakeup_fd(-1)
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})  # type: ignore[call-overload]
        module = str(request["module"])
        sys.argv = [module]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkServer:
    """The serving loop: accepts connections, forks on each request, reports exits."""

    def __init__(self, *, listener: socket.socket) -> None:
        self._listener = listener
        self._sel = selectors.DefaultSelector()
        self._pending: dict[socket.socket, bytes] = {}  # connections whose request is partial
        self._child_of: dict[socket.socket, int] = {}
        self._conn_of: dict[int, socket.socket] = {}
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the selector
        self._wake, self._wake_w = wake_r, wake_w
        self._sel.register(listener, selectors.EVENT_READ, "accept")
        self._sel.register(wake_r, selectors.EVENT_READ, "wake")

    def serve(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":  # a child ended: reaped below
                    os.read(self._wake, 4096)
                else:
                    self._readable(key.fileobj)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> None:
        conn, _ = self._listener.accept()
        self._pending[conn] = b""
        self._sel.register(conn, selectors.EVENT_READ, "conn")

    def _readable(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if conn in self._child_of:  # anything after the request, or EOF: the client is gone
            if not data:
                self._client_gone(conn)
            return
        if not data:
            self._close(conn)
            return
        buf = self._pending[conn] + data
        if b"\n" not in buf:
            if len(buf) > MAX_REQUEST:
                self._close(conn)
            else:
                self._pending[conn] = buf
            return
        del self._pending[conn]
        try:
            request = json.loads(buf.split(b"\n", 1)[0])
        except ValueError:
            self._close(conn)  # not a request: nothing forked
            return
        self._fork(conn, request)

    def _fork(self, conn: socket.socket, request: dict[str, object]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        keep = [self._listener.fileno(), self._sel.fileno(), self._wake, self._wake_w]
        keep += [s.fileno() for s in (conn, *self._pending, *self._child_of)]
        server_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            _run_child(request, keep, server_pid)
        self._child_of[conn] = pid
        self._conn_of[pid] = conn
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            self._client_gone(conn)

    def _client_gone(self, conn: socket.socket) -> None:
        pid = self._child_of.get(conn)  # still running: an ended child's connection is closed
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self._close(conn)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self._conn_of.pop(pid, None)
            if conn is not None and conn in self._child_of:
                try:
                    conn.sendall(f"exit {_exit_code(status)}\n".encode())
                except OSError:
                    pass
                self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        self._pending.pop(conn, None)
        pid = self._child_of.pop(conn, None)
        if pid is not None:
            self._conn_of.pop(pid, None)
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()


def main() -> int:
    path = sys.argv[1]
    _die_with_parent()
    for name in PRELOAD:
        importlib.import_module(name)
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    print(f"forkserver ready on {path}", flush=True)
    try:
        ForkServer(listener=listener).serve()
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
