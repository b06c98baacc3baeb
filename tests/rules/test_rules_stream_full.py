"""A full RULES stream while the rules service is down (issue 35): every message whose
publisher got a PUBACK stays in the stream and reaches the rule once the service is back; the
publishes past the stream's limit are refused with 0x97, not acknowledged and dropped. Also: a
stream made by an older version (discard old, an age limit) is brought to the current config
when the rules service starts.

A mesh of its own (one node, the stream limited to 1 MiB), since the test kills the rules
service and fills the stream."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import nats
import pytest
import redis
from nats.js.api import DiscardPolicy

from services.cli.launcher import Launcher
from services.common.bus import subjects
from services.rules.consumer import rules_stream_config
from starling.rules.v1 import rules_pb2 as pb
from starling.rules.v1 import rules_pb2_grpc as pb_grpc
from tests.e2e.clients import Paho
from tests.faults.harness import fault_launcher
from tests.poll import wait_until

TENANT = "default"  # anonymous clients
STREAM_BYTES = 1 << 20  # the setting's minimum
PAYLOAD = 16 << 10  # about 64 messages fill the stream
QUOTA_EXCEEDED = 0x97


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    folder: Path = tmp_path_factory.mktemp("rules-full")
    with fault_launcher(folder, nodes=1, STARLING_RULES_STREAM_MAX_BYTES=str(STREAM_BYTES)) as m:
        yield m


def _nats_url(launcher: Launcher) -> str:
    password = launcher.secrets.nats["operator"]
    return f"nats://operator:{password}@127.0.0.1:{launcher.mesh.by_name('nats').port}"


def _redis_url(launcher: Launcher) -> str:
    port = launcher.mesh.by_name("redis").port
    return f"redis://:{launcher.secrets.redis_password}@127.0.0.1:{port}/0"


def _stream(launcher: Launcher, old: bool = False) -> tuple[str, float, int]:
    """The RULES stream's discard policy, age limit and message count; `old`: first put
    the config an older version created (discard old, 7 days)."""

    async def go() -> tuple[str, float, int]:
        nc = await nats.connect(_nats_url(launcher))
        try:
            js = nc.jetstream()
            if old:
                cfg = rules_stream_config(7 * 24 * 3600.0, STREAM_BYTES)
                cfg.discard = DiscardPolicy.OLD
                await js.update_stream(cfg)
            info = await js.stream_info(subjects.RULES_STREAM)
            discard = str(getattr(info.config.discard, "value", info.config.discard))
            return discard, info.config.max_age or 0.0, info.state.messages
        finally:
            await nc.close()

    return asyncio.run(go())


def _create_rule(launcher: Launcher, tag: str, stream_key: str) -> None:
    md = [("authorization", f"Bearer {launcher.admin_token}")]
    addr = f"127.0.0.1:{launcher.mesh.by_name('rules').grpc_port}"
    action = pb.Action(kind="redis", params={"url": _redis_url(launcher), "stream": stream_key})
    with grpc.insecure_channel(addr) as ch:
        pb_grpc.RulesAdminServiceStub(ch).CreateRule(
            pb.CreateRuleRequest(
                rule=pb.Rule(
                    tenant=TENANT,
                    rule_id=f"r-{tag}",
                    sql=f'SELECT payload FROM "full/{tag}/#"',
                    enabled=True,
                    actions=[action],
                )
            ),
            metadata=md,
        )


def test_an_older_stream_config_is_updated_when_the_rules_service_starts(
    launcher: Launcher,
) -> None:
    assert _stream(launcher, old=True)[:2] == ("old", 7 * 24 * 3600.0)
    launcher.restart("rules")
    assert _stream(launcher)[:2] == ("new", 0.0)


def test_a_full_stream_refuses_with_0x97_and_loses_nothing_acknowledged(
    launcher: Launcher,
) -> None:
    tag = uuid.uuid4().hex[:6]
    stream_key = f"full-{tag}"
    _create_rule(launcher, tag, stream_key)
    r = redis.Redis.from_url(_redis_url(launcher))
    pub = Paho(launcher.mesh.by_name("connection-0").port)
    pub.connect()

    def probe_arrived() -> bool:  # the node knows the rule (docs/rules.md, Known gaps)
        pub.c.publish(f"full/{tag}/probe", b"-1", qos=1).wait_for_publish(5)
        return r.xlen(stream_key) > 0

    wait_until(probe_arrived, 20)
    wait_until(lambda: _stream(launcher)[2] == 0)  # the probes were consumed
    launcher.kill("rules")

    acked: list[int] = []
    refused: list[int] = []
    filler = b"x" * PAYLOAD
    for i in range(200):
        rc = pub.publish(f"full/{tag}/m", str(i).encode() + b":" + filler, qos=1)
        assert rc is not None, f"no PUBACK for message {i}"
        (acked if rc.value < 0x80 else refused).append(i)
        if rc.value >= 0x80:
            assert rc.value == QUOTA_EXCEEDED, f"message {i}: PUBACK {rc}"
        if len(refused) >= 10:
            break
    # (b) past the limit the publisher is told, not acknowledged and dropped.
    assert refused, f"all {len(acked)} messages acknowledged: the full stream dropped some"
    assert acked and max(acked) < min(refused)
    # (a) every acknowledged message is still in the stream ...
    assert _stream(launcher)[2] == len(acked)
    launcher.restart("rules")

    def arrived() -> set[int]:
        return {int(f[b"payload"].split(b":", 1)[0]) for _, f in r.xrange(stream_key)} - {-1}

    # ... and reaches the rule once the rules service is back.
    wait_until(lambda: len(arrived()) >= len(acked), 60)
    assert arrived() == set(acked)
    r.delete(stream_key)
    r.close()
    pub.close()
