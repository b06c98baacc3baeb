"""docs/architecture.md's module map names every module, and only modules that exist.

The map is the first fenced code block after the heading ``## Module map``.
Each of its lines is one of:

- a *folder line*: no indentation, a path ending in ``/`` (``services/queue/``),
  then optional text. It sets the folder of the entry lines below it.
- a *full-path line*: no indentation, a path ending in ``.py``
  (``services/common/message.py``), then what it owns. It names that file and
  ends the folder: entry lines after it need a new folder line.
- an *entry line*: indented by exactly two spaces, then one name relative to
  the current folder (``core.py``, ``channel/state.py``, ``templates/``) or
  several joined by `` / `` (``main.py / api.py / config.py``), then what
  they own.
- a *continuation line*: indented by more than two spaces; more text for the
  line above, naming nothing.

The names end at the first run of two spaces; the text after them says what
the modules own and may not be empty. A map line is at most 100 characters.

Every Python module under services/ and analytics/ must be named, except
``__init__.py``, ``__main__.py`` and generated ``*_pb2*`` files; every name
must exist (a name ending in ``/`` as a folder).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
HEADING = "## Module map"
MAX_LINE_CHARS = 100
CODE_ROOTS = ("services", "analytics")
_NAMES_END = re.compile(r"\s{2,}")


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in the map: its path from the repository root and its line."""

    path: str
    line_no: int
    described: bool


def map_lines(text: str) -> list[tuple[int, str]]:
    """The map's lines with their 1-based line numbers in the document."""
    lines = text.splitlines()
    assert HEADING in lines, f"docs/architecture.md has no heading {HEADING!r}"
    start = lines.index(HEADING)
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```"))
    end = next(i for i in range(fence + 1, len(lines)) if lines[i].startswith("```"))
    return [(i + 1, lines[i]) for i in range(fence + 1, end)]


def _split(body: str) -> tuple[list[str], str]:
    """Names (joined by `` / ``) and the text after them."""
    parts = _NAMES_END.split(body.strip(), maxsplit=1)
    names = [name.strip() for name in parts[0].split(" / ")]
    return names, parts[1].strip() if len(parts) > 1 else ""


def parse_map(lines: list[tuple[int, str]]) -> list[Entry]:
    """Every name the map gives, folders included, as paths from the root."""
    entries: list[Entry] = []
    folder: str | None = None
    for line_no, line in lines:
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip() or indent > 2:
            continue
        names, text = _split(line)
        if indent == 0:
            assert len(names) == 1, f"line {line_no}: a full path names one file"
            folder = names[0] if names[0].endswith("/") else None
            entries.append(Entry(names[0].rstrip("/"), line_no, bool(text) or bool(folder)))
            continue
        assert indent == 2, f"line {line_no}: an entry line is indented by two spaces"
        assert folder is not None, f"line {line_no}: an entry line needs a folder line above"
        entries.extend(Entry(folder + name.rstrip("/"), line_no, bool(text)) for name in names)
    return entries


def python_modules() -> set[str]:
    """Every hand-written Python module under services/ and analytics/."""
    found: set[str] = set()
    for root in CODE_ROOTS:
        for path in (ROOT / root).rglob("*.py"):
            if path.name in ("__init__.py", "__main__.py") or "_pb2" in path.name:
                continue
            found.add(path.relative_to(ROOT).as_posix())
    return found


def _entries() -> list[Entry]:
    return parse_map(map_lines(DOC.read_text()))


def test_every_module_is_in_the_map() -> None:
    named = {entry.path for entry in _entries()}
    missing = sorted(python_modules() - named)
    assert not missing, (
        f"{len(missing)} modules missing from docs/architecture.md's module map:\n"
        + "\n".join(missing)
    )


def test_every_name_in_the_map_exists() -> None:
    absent = [
        f"line {entry.line_no}: {entry.path}"
        for entry in _entries()
        if not (ROOT / entry.path).exists()
    ]
    assert not absent, "the module map names what does not exist:\n" + "\n".join(absent)


def test_every_map_line_is_short_and_says_what_it_owns() -> None:
    lines = map_lines(DOC.read_text())
    long = [f"line {no} ({len(line)} chars)" for no, line in lines if len(line) > MAX_LINE_CHARS]
    assert not long, "module map lines over 100 characters:\n" + "\n".join(long)
    mute = [f"line {e.line_no}: {e.path}" for e in parse_map(lines) if not e.described]
    assert not mute, "module map names without a description:\n" + "\n".join(mute)


def test_no_module_is_named_twice() -> None:
    paths = [entry.path for entry in _entries() if entry.path.endswith(".py")]
    twice = sorted({path for path in paths if paths.count(path) > 1})
    assert not twice, "named twice in the module map:\n" + "\n".join(twice)


def test_the_parser_reads_every_form_of_line() -> None:
    text = "\n".join(
        [
            HEADING,
            "",
            "```",
            "services/x/                  the x service",
            "  core.py                    pure rules",
            "  main.py / api.py           composition, servicer",
            "                             (a continuation, naming nothing.py)",
            "  sub/deep.py                a module in a sub-package",
            "services/common/tasks.py     a full-path line",
            "services/y/",
            "  bare.py",
            "```",
        ]
    )
    entries = parse_map(map_lines(text))
    assert [(e.path, e.described) for e in entries] == [
        ("services/x", True),
        ("services/x/core.py", True),
        ("services/x/main.py", True),
        ("services/x/api.py", True),
        ("services/x/sub/deep.py", True),
        ("services/common/tasks.py", True),
        ("services/y", True),
        ("services/y/bare.py", False),
    ]
