"""Validation of action params (the proto's string map): each reader names the param in the
ValueError it raises, which the admin API returns as INVALID_ARGUMENT."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path


class Params:
    """Reads typed params and remembers which were read, so unknown ones can be refused."""

    def __init__(self, kind: str, raw: Mapping[str, str]) -> None:
        self.kind = kind
        self.raw = dict(raw)
        self._seen: set[str] = set()

    def text(self, name: str, default: str | None = None) -> str:
        self._seen.add(name)
        value = self.raw.get(name)
        if value is None or value == "":
            if default is None:
                raise ValueError(f"{name}: required by the {self.kind} action")
            return default
        return value

    def opt(self, name: str) -> str | None:
        self._seen.add(name)
        value = self.raw.get(name)
        return value if value else None

    def integer(self, name: str, default: int, lo: int, hi: int) -> int:
        text = self.text(name, str(default))
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{name}: {text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise ValueError(f"{name}: {value} is outside {lo}..{hi}")
        return value

    def number(self, name: str, default: float, lo: float, hi: float) -> float:
        text = self.text(name, str(default))
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name}: {text!r} is not a number") from None
        if not lo <= value <= hi:
            raise ValueError(f"{name}: {value} is outside {lo}..{hi}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        text = self.text(name, "true" if default else "false").lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{name}: {text!r} is not true or false")

    def choice(self, name: str, default: str, choices: Collection[str]) -> str:
        value = self.text(name, default)
        if value not in choices:
            raise ValueError(f"{name}: {value!r} is not one of {', '.join(sorted(choices))}")
        return value

    def file(self, name: str) -> Path | None:
        value = self.opt(name)
        if value is None:
            return None
        path = Path(value)
        if not path.is_file():
            raise ValueError(f"{name}: no file {value}")
        return path

    def prefixed(self, prefix: str) -> dict[str, str]:
        """Params `<prefix><key>` as {key: value} (HTTP's `header.<Name>`)."""
        out = {}
        for key, value in self.raw.items():
            if key.startswith(prefix) and len(key) > len(prefix):
                self._seen.add(key)
                out[key[len(prefix) :]] = value
        return out

    def done(self) -> None:
        """Refuse params no reader asked for (a typo must not pass silently)."""
        unknown = sorted(set(self.raw) - self._seen)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown param of the {self.kind} action")
