"""The CQL subset the stores issue, parsed into statements the model executes.

INSERT / UPDATE / DELETE / SELECT [DISTINCT] with WHERE on key columns (=, <, <=, >, >=, IN),
IF EXISTS / IF NOT EXISTS / IF conditions, USING TTL / TIMESTAMP, LIMIT, BEGIN ... APPLY BATCH,
CREATE TABLE (static columns, compound keys, default_time_to_live) and ALTER TABLE ADD. Bind
markers are `?` or `%s`, numbered left to right across the whole text. Anything else raises
`CqlError`: the model never guesses what an unknown statement means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)"
    r"|(?P<op><=|>=|!=|%s|[=<>(),;?*]))"
)


class CqlError(Exception):
    """A statement outside the subset (or malformed)."""


@dataclass(frozen=True, slots=True)
class Val:
    """A value: a bind marker (`bind` its position) or a literal."""

    bind: int = -1
    lit: Any = None

    def get(self, values: tuple[Any, ...]) -> Any:
        return values[self.bind] if self.bind >= 0 else self.lit


@dataclass(frozen=True, slots=True)
class Rel:
    col: str
    op: str  # = < <= > >= != IN
    val: Val


@dataclass(slots=True)
class Stmt:
    kind: str  # insert update delete select batch create alter
    table: str = ""
    cols: list[str] = field(default_factory=list)
    vals: list[Val] = field(default_factory=list)  # insert values / update set values
    where: list[Rel] = field(default_factory=list)
    conds: list[Rel] = field(default_factory=list)
    if_exists: bool = False
    if_not_exists: bool = False
    ttl: Val | None = None
    timestamp: Val | None = None
    limit: Val | None = None
    distinct: bool = False
    parts: list[Stmt] = field(default_factory=list)  # batch
    schema: dict[str, Any] = field(default_factory=dict)  # create / alter

    @property
    def conditional(self) -> bool:
        return self.if_exists or self.if_not_exists or bool(self.conds)


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise CqlError(f"cannot read {text[pos : pos + 20]!r}")
            kind = m.lastgroup or ""
            self.toks.append((kind, m.group(kind)))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.i = 0
        self.binds = 0

    def peek(self, word: str | None = None) -> bool:
        if self.i >= len(self.toks):
            return False
        return word is None or self.toks[self.i][1].upper() == word

    def take(self, word: str | None = None) -> str:
        if self.i >= len(self.toks) or (word and self.toks[self.i][1].upper() != word):
            got = self.toks[self.i][1] if self.i < len(self.toks) else "end"
            raise CqlError(f"expected {word or 'a token'}, got {got!r}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def name(self) -> str:
        kind, text = self.toks[self.i]
        if kind != "name":
            raise CqlError(f"expected a name, got {text!r}")
        self.i += 1
        return text.rsplit(".", 1)[-1].lower()

    def value(self) -> Val:
        kind, text = self.toks[self.i]
        self.i += 1
        if text in ("?", "%s"):
            self.binds += 1
            return Val(bind=self.binds - 1)
        if kind == "num":
            return Val(lit=int(text))
        if kind == "str":
            return Val(lit=text[1:-1].replace("''", "'"))
        if text.lower() in ("true", "false"):
            return Val(lit=text.lower() == "true")
        if text.lower() == "null":
            return Val(lit=None)
        raise CqlError(f"unexpected value {text!r}")

    def rels(self) -> list[Rel]:
        out = [self.rel()]
        while self.peek("AND"):
            self.take("AND")
            out.append(self.rel())
        return out

    def rel(self) -> Rel:
        col = self.name()
        op = self.take().upper()
        if op not in ("=", "<", "<=", ">", ">=", "!=", "IN"):
            raise CqlError(f"operator {op!r}")
        return Rel(col, op, self.value())

    def using(self, st: Stmt) -> None:
        while self.peek("USING") or ((st.ttl or st.timestamp) and self.peek("AND")):
            self.take()
            what = self.take().upper()
            if what == "TTL":
                st.ttl = self.value()
            elif what == "TIMESTAMP":
                st.timestamp = self.value()
            else:
                raise CqlError(f"USING {what}")

    def conditions(self, st: Stmt) -> None:
        if not self.peek("IF"):
            return
        self.take("IF")
        if self.peek("NOT"):
            self.take("NOT")
            self.take("EXISTS")
            st.if_not_exists = True
        elif self.peek("EXISTS"):
            self.take("EXISTS")
            st.if_exists = True
        else:
            st.conds = self.rels()

    def names(self) -> list[str]:
        out = [self.name()]
        while self.peek(","):
            self.take(",")
            out.append(self.name())
        return out

    def statement(self) -> Stmt:
        head = self.take().upper()
        parse = getattr(self, f"_{head.lower()}", None)
        if parse is None:
            raise CqlError(f"statement {head!r}")
        st: Stmt = parse()
        if self.peek(";"):
            self.take(";")
        return st

    def _insert(self) -> Stmt:
        self.take("INTO")
        st = Stmt("insert", self.name())
        self.take("(")
        st.cols = self.names()
        self.take(")")
        self.take("VALUES")
        self.take("(")
        st.vals = [self.value()]
        while self.peek(","):
            self.take(",")
            st.vals.append(self.value())
        self.take(")")
        self.conditions(st)
        self.using(st)
        return st

    def _update(self) -> Stmt:
        st = Stmt("update", self.name())
        self.using(st)
        self.take("SET")
        while True:
            st.cols.append(self.name())
            self.take("=")
            st.vals.append(self.value())
            if not self.peek(","):
                break
            self.take(",")
        self.take("WHERE")
        st.where = self.rels()
        self.conditions(st)
        return st

    def _delete(self) -> Stmt:
        cols = [] if self.peek("FROM") else self.names()
        self.take("FROM")
        st = Stmt("delete", self.name(), cols=cols)
        self.using(st)
        self.take("WHERE")
        st.where = self.rels()
        self.conditions(st)
        return st

    def _select(self) -> Stmt:
        st = Stmt("select", distinct=self.peek("DISTINCT"))
        if st.distinct:
            self.take()
        if self.peek("*"):
            self.take()
            st.cols = ["*"]
        else:
            st.cols = self.names()
        self.take("FROM")
        st.table = self.name()
        if self.peek("WHERE"):
            self.take()
            st.where = self.rels()
        if self.peek("LIMIT"):
            self.take()
            st.limit = self.value()
        return st

    def _begin(self) -> Stmt:
        if self.peek("UNLOGGED"):
            self.take()
        self.take("BATCH")
        st = Stmt("batch")
        while not self.peek("APPLY"):
            st.parts.append(self.statement())
        self.take("APPLY")
        self.take("BATCH")
        return st

    def _create(self) -> Stmt:
        self.take("TABLE")
        if self.peek("IF"):
            self.take("IF")
            self.take("NOT")
            self.take("EXISTS")
        st = Stmt("create", self.name())
        cols: dict[str, tuple[str, bool]] = {}
        pk: list[str] = []
        ck: list[str] = []
        self.take("(")
        while True:
            col = self.name()
            if col == "primary":
                self.take("KEY")
                pk, ck = self._key()
            else:
                typ = self.name()
                static = self.peek("STATIC") and bool(self.take())
                if self.peek("PRIMARY"):
                    self.take()
                    self.take("KEY")
                    pk = [col]
                cols[col] = (typ, static)
            if self.peek(")"):
                break
            self.take(",")
        self.take(")")
        ttl = 0
        while self.i < len(self.toks):  # WITH ... options: only the default TTL matters
            if self.take().lower() == "default_time_to_live":
                self.take("=")
                ttl = int(self.value().lit)
        st.schema = {"cols": cols, "pk": pk, "ck": ck, "ttl": ttl}
        return st

    def _key(self) -> tuple[list[str], list[str]]:
        self.take("(")
        if self.peek("("):
            self.take("(")
            pk = self.names()
            self.take(")")
        else:
            pk = [self.name()]
        ck: list[str] = []
        while self.peek(","):
            self.take(",")
            ck.append(self.name())
        self.take(")")
        return pk, ck

    def _alter(self) -> Stmt:
        self.take("TABLE")
        st = Stmt("alter", self.name())
        self.take("ADD")
        col = self.name()
        st.schema = {"col": col, "type": self.name()}
        return st


_CACHE: dict[str, Stmt] = {}


def parse(text: str) -> Stmt:
    """The statement `text` (cached: the stores prepare a few dozen texts)."""
    st = _CACHE.get(text)
    if st is None:
        p = _Parser(text)
        st = p.statement()
        if p.i != len(p.toks):
            raise CqlError(f"trailing text in {text!r}")
        _CACHE[text] = st
    return st
