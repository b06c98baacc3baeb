"""What the per-publish quota check costs: a channel receiving QoS 0 publishes (the node's
hot path in the channel) with no gate, with a tenant whose budgets are unlimited, and with a
limited tenant whose buckets hold plenty of tokens. `python -m bench.quota_gate`.

Then the same for the outbound bandwidth check (bytes_out_per_s): a channel writing QoS 0
deliveries with no delivery gate and with a limited one with tokens to spare. (A tenant
without the limit has no gate on its connections' delivery path: DeliveryGate.refresh.)

The publishes come `BATCH` to a receive() call, as a busy socket read delivers them (the
publish gate charges its buckets once per read); `python -m bench.quota_gate 1` measures
one publish per read, the gate's worst case.

Prints microseconds per publish (delivery) for each; the difference to "no gate" is the
check."""

from __future__ import annotations

import sys
import time

from services.common.connect import ConnectOutcome
from services.common.message import Message
from services.common.mqtt import EMPTY, Connect, Publish, encode
from services.connection.budget import LIMITED, UNLIMITED, Bucket, DeliveryGate, PublishGate
from services.connection.channel import Channel, ChannelConfig
from services.connection.channel.hooks import NO_HOOKS

BATCH = int(sys.argv[1]) if len(sys.argv) > 1 else 100  # publishes per receive() call
ROUNDS = 200_000 // BATCH


def _gate(state: int, scopes: int = 2) -> PublishGate:
    def bucket(resource: str) -> Bucket:
        b = Bucket(("t", "", resource), lambda b: None)
        b.state, b.tokens, b.expires = state, 10**15, float("inf")
        b.set_limit(10**12)
        return b

    pairs = tuple(
        (bucket("messages_per_s"), bucket("bytes_in_per_s"))  # tenant (and user)
        for _ in range(scopes)
    )
    return PublishGate(
        tenant="t", buckets=pairs, clock=time.monotonic, on_refused=lambda r, t: None
    )


def run(gate: PublishGate | None, reps: int = 5) -> float:
    ch = Channel(
        ChannelConfig(),
        "peer",
        0.0,
        lambda: "c",
        gates=(lambda t, u, hooks: gate) if gate else None,
    )
    ch.receive(encode(Connect("c", 5, keepalive_s=0, properties=EMPTY), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1, identity="t/u"), 0.0)
    data = encode(Publish("bench/topic", b"x" * 32, 0), 5) * BATCH
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()  # CPU time: less disturbed by a busy machine
        for _ in range(ROUNDS // 5):
            ch.receive(data, 1.0)
        best = min(best, time.process_time() - start)
    return best / (ROUNDS // 5 * BATCH) * 1e6


def _out_gate(state: int) -> DeliveryGate:
    def bucket() -> Bucket:
        b = Bucket(("t", "", "bytes_out_per_s"), lambda b: None)
        b.state, b.tokens, b.expires = state, 10**15, float("inf")
        b.set_limit(10**12)
        return b

    return DeliveryGate(
        tenant="t",
        buckets=(bucket(), bucket()),
        clock=time.monotonic,
        on_refused=lambda r, t: None,
        wait=lambda b: None,
        hooks=NO_HOOKS,
    )


def run_out(gate: DeliveryGate | None, reps: int = 5) -> float:
    ch = Channel(ChannelConfig(), "peer", 0.0, lambda: "c")
    ch.receive(encode(Connect("c", 5, keepalive_s=0, properties=EMPTY), 5), 0.0)
    ch.authenticated(ConnectOutcome(tenant="t", epoch=1, identity="t/u"), 0.0)
    ch.outbound.gate = gate
    msg = Message("t", "bench/topic", b"x" * 32, 0, False)
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        for _ in range(ROUNDS // 5):
            for _ in range(BATCH):
                ch.deliver(msg, 0, False, (), 1.0)
            ch.out.clear()  # as the transport takes it
        best = min(best, time.process_time() - start)
    return best / (ROUNDS // 5 * BATCH) * 1e6


def main() -> None:
    main_in()
    cases: dict[str, DeliveryGate | None] = {
        "no gate": None,
        "limited tenant+user": _out_gate(LIMITED),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(6):
        for name, gate in cases.items():
            best[name] = min(best[name], run_out(gate, 2))
    for name, us in best.items():
        print(f"out: {name:<19} {us:6.3f} us/delivery (+{us - best['no gate']:5.3f})")


def main_in() -> None:
    cases: dict[str, PublishGate | None] = {
        "no gate": None,
        "unlimited tenant+user": _gate(UNLIMITED),
        "limited tenant+user": _gate(LIMITED),
        "limited tenant (no user)": _gate(LIMITED, 1),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(6):  # interleaved: a burst of load elsewhere hits every case alike
        for name, gate in cases.items():
            best[name] = min(best[name], run(gate, 2))
    for name, us in best.items():
        print(f"{name:<24} {us:6.3f} us/publish  (+{us - best['no gate']:5.3f})")


if __name__ == "__main__":
    main()
