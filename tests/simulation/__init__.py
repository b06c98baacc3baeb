"""A deterministic simulation of what Cassandra guarantees, to run the REAL Cassandra stores
against (docs/storage.md, "How the simulation works").

Modules: cql.py (the CQL subset, parsed), data.py (a replica's cells and tombstones),
statements.py (what a statement does to a table), cluster.py (replicas, hints, Paxos per
partition, faults), session.py (the driver Session the stores call), scheduler.py (the seeded
scheduler), standin.py (the model as a plain Cassandra stand-in), queue_world.py (the queue
hand-over world and its invariants), unfixed.py (issue 36's fixes taken out again),
legacy.py (the queue store from before issue 36, read from git).

Putting a store on the model::

    rng = random.Random(seed)
    cluster = Cluster(random.Random(rng.getrandbits(64)), Faults())  # or NO_FAULTS
    sched = Scheduler(random.Random(rng.getrandbits(64)))
    session = SimSession(cluster, sched, ConsistencyLevel.LOCAL_QUORUM)
    session.create(MyStore.migrations)           # CREATE TABLE / AddColumn steps
    store = MyStore.on_session(session, ConsistencyLevel.SERIAL, SimBatch)

`CassandraBase.on_session` (services/common/store/cassandra.py) builds any Cassandra store on
a session without connecting; the store must make its batches with `self._batch(parts)`.

Running processes: `await sched.run({"name": coroutine, ...}, max_steps)` inside
`asyncio.run`; every store call waits in `sched.pending` until the seed picks it, so calls are
delayed, reordered, paused (per process) and answered with the driver's real exceptions
(`WriteTimeout` with write type CAS: outcome unknown). `sched.sleep(n)` lets a process wait n
of its own steps. Append checks to `sched.checks` (run after every step) and hooks to
`cluster.on_effect` (called when a write first takes effect, before it lands);
`cluster.truth(table, pk)` is what the replicas converge to. `standin.model_session()` gives
a free-running, fault-free session for ordinary async tests.

Replaying: the same seed gives the same run (nothing else is random; the loop is drained
after every step). Set `sched.tracing = True` to keep every call, its values and its result
in `sched.trace`.
"""
