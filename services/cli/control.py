"""Requests to a running `starling up` (`starling restart NAME`), as files in
`<data-dir>/control/`.

A request is `<id>.request` (JSON: the action and the component's name), written whole and
renamed into place; the launcher looks for requests on every supervision tick, removes each
one it takes and writes `<id>.answer` (JSON: the new pid, or an error) the same way. Files
need no socket path limits, survive nothing they should not (a dead launcher answers nothing,
and the caller says so), and a request left by a launcher that died is ignored by the next
one's start (the folder is emptied).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CONTROL_DIR = "control"


@dataclass(frozen=True, slots=True)
class Request:
    id: str
    action: str  # "restart"
    name: str


@dataclass(frozen=True, slots=True)
class Answer:
    pid: int = 0
    error: str = ""


def _write(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload))
    tmp.replace(path)


def reset(data_dir: Path) -> None:
    """A new launcher starts with no requests or answers left over."""
    folder = data_dir / CONTROL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink(missing_ok=True)


def pending(data_dir: Path) -> list[Request]:
    """Requests waiting, oldest first; each is removed as it is read."""
    folder = data_dir / CONTROL_DIR
    found = []
    for f in sorted(folder.glob("*.request"), key=lambda p: p.stat().st_mtime):
        try:
            raw = json.loads(f.read_text())
            f.unlink()
        except (OSError, ValueError):
            continue
        found.append(Request(f.stem, str(raw.get("action", "")), str(raw.get("name", ""))))
    return found


def answer(data_dir: Path, request: Request, reply: Answer) -> None:
    payload: dict[str, object] = {"pid": reply.pid, "error": reply.error}
    _write(data_dir / CONTROL_DIR / f"{request.id}.answer", payload)


def ask(
    data_dir: Path,
    action: str,
    name: str,
    *,
    alive: Callable[[], bool],
    timeout_s: float,
) -> Answer:
    """Leave a request and wait for its answer while `alive()` (the launcher runs);
    TimeoutError after `timeout_s`, ConnectionError when the launcher is gone."""
    folder = data_dir / CONTROL_DIR
    folder.mkdir(parents=True, exist_ok=True)
    rid = uuid.uuid4().hex
    _write(folder / f"{rid}.request", {"action": action, "name": name, "from_pid": os.getpid()})
    reply = folder / f"{rid}.answer"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if reply.exists():
            raw = json.loads(reply.read_text())
            reply.unlink(missing_ok=True)
            return Answer(pid=int(raw.get("pid", 0)), error=str(raw.get("error", "")))
        if not alive():
            (folder / f"{rid}.request").unlink(missing_ok=True)
            raise ConnectionError("the launcher is not running")
        time.sleep(0.1)
    (folder / f"{rid}.request").unlink(missing_ok=True)
    raise TimeoutError(f"no answer from the launcher in {timeout_s:.0f} s")
