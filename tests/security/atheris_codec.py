"""Coverage-guided fuzzing of the MQTT decoder with atheris (optional: `pip install
'.[fuzz]'`). Run by hand for as long as you like, from the repository root:

    .venv/bin/python tests/security/atheris_codec.py -max_len=4096 -runs=1000000

The first input byte picks the protocol level the stream is read at and how the rest is cut
into chunks; the decoder runs with a connection node's limits. Anything but an `MqttError`
escaping `Decoder.feed` is a finding (atheris reports the exception and the input).
The suite runs it briefly (tests/security/test_codec_fuzz.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports():
    from services.common.mqtt import DecodeLimits, Decoder, MqttError

LIMITS = DecodeLimits(max_user_properties=256, max_topic_filters=100)


def one_input(data: bytes) -> None:
    if not data:
        return
    control = data[0]
    level = (3, 4, 5, 5)[control & 3]
    chunk = 1 + (control >> 2) * 8  # 1 to 505 bytes per feed
    dec = Decoder(level, 64 << 10, LIMITS)
    body = data[1:]
    for i in range(0, len(body), chunk):
        try:
            dec.feed(body[i : i + chunk])
        except MqttError:
            return


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
