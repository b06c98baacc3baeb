"""The real Cassandra store classes on the simulator's healthy model of Cassandra
(tests/simulation/standin.py), so the store contract tests run the Cassandra code here, where
no server runs: fixture param "model" beside "sqlite" and "cassandra"."""

from __future__ import annotations

from typing import Any

from cassandra import ConsistencyLevel

from tests.simulation.session import SimBatch, SimSession
from tests.simulation.standin import model_session


def model_for(cls: Any, seed: int = 0) -> SimSession:
    """A fresh model cluster with `cls`'s tables."""
    return model_session(seed, cls.migrations)


def on_model(cls: Any, session: SimSession | None = None) -> Any:
    """A `cls` store on `session` (a fresh model cluster when None)."""
    return cls.on_session(session or model_for(cls), ConsistencyLevel.SERIAL, SimBatch)
