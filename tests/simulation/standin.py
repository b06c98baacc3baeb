"""The model as a Cassandra stand-in for ordinary async tests (the store contract tests): a
free-running scheduler (each call runs when the event loop gets to it), no injected faults, a
lightweight transaction committed to a random quorum of 3 replicas and reads at LOCAL_QUORUM,
so a test sees what a healthy cluster guarantees and no more."""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

from cassandra import ConsistencyLevel

from tests.simulation.cluster import NO_FAULTS, Cluster
from tests.simulation.scheduler import Scheduler
from tests.simulation.session import SimBatch, SimSession


def model_session(seed: int = 0, migrations: Any = ()) -> SimSession:
    """A session on a fresh healthy model cluster with the given migrations' tables."""
    rng = random.Random(seed)
    cluster = Cluster(random.Random(rng.getrandbits(64)), NO_FAULTS)
    sched = Scheduler(random.Random(rng.getrandbits(64)), free=True)
    session = SimSession(cluster, sched, ConsistencyLevel.LOCAL_QUORUM, fetch_size=50)
    session.create(migrations)
    return session


def store_on(session: SimSession, module: ModuleType | None = None) -> Any:
    """A queue store (the real class of `module`, the current one by default) on `session`."""
    if module is None:
        from services.common.store import cassandra_queue as module
    return module.CassandraQueueStore.on_session(session, ConsistencyLevel.SERIAL, SimBatch)
