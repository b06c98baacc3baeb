"""SCRAM-SHA-256/512 server steps (services/session/scram.py) against the RFC 7677 example
and an independent client (tests/scram_client.py)."""

from __future__ import annotations

import base64

import pytest

from services.session import scram
from services.session.credentials import Credentials, create, parse
from tests.scram_client import ScramClient

# RFC 7677 section 3: user "user", password "pencil".
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_NONCE = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = f"r={RFC_SERVER_NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_rfc_7677_example() -> None:
    verifier = scram.make_verifier("SCRAM-SHA-256", "pencil", 4096, RFC_SALT)
    client = scram.parse_client_first(RFC_CLIENT_FIRST)
    assert client.username == "user"
    exchange = scram.Exchange(
        "SCRAM-SHA-256", "n,,", client.bare, RFC_SERVER_FIRST, RFC_SERVER_NONCE
    )
    assert scram.final(RFC_CLIENT_FINAL, exchange, verifier) == RFC_SERVER_FINAL
    wrong = scram.make_verifier("SCRAM-SHA-256", "pencil2", 4096, RFC_SALT)
    with pytest.raises(scram.ScramError):
        scram.final(RFC_CLIENT_FINAL, exchange, wrong)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize(("given", "ok"), [("s3cret", True), ("guess", False)])
def test_exchange_with_an_independent_client(mechanism: str, given: str, ok: bool) -> None:
    verifier = scram.make_verifier(mechanism, "s3cret")
    client = ScramClient(mechanism, "acme/dev,1", given)
    first = scram.parse_client_first(client.first())
    assert first.username == "acme/dev,1"  # =2C unescaped
    server_first, state = scram.first(mechanism, first, verifier)
    exchange = scram.read_state(state)
    assert exchange.username == "acme/dev,1"
    client_final = client.final(server_first)
    if ok:
        assert client.verify(scram.final(client_final, exchange, verifier))
    else:
        with pytest.raises(scram.ScramError):
            scram.final(client_final, exchange, verifier)


def test_a_replayed_or_altered_final_message_fails() -> None:
    verifier = scram.make_verifier("SCRAM-SHA-256", "pw")
    client = ScramClient("SCRAM-SHA-256", "u", "pw")
    first = scram.parse_client_first(client.first())
    server_first, state = scram.first("SCRAM-SHA-256", first, verifier)
    final = client.final(server_first)
    # Another exchange (another server nonce) does not accept this proof.
    _, other_state = scram.first("SCRAM-SHA-256", first, verifier)
    with pytest.raises(scram.ScramError, match="nonce"):
        scram.final(final, scram.read_state(other_state), verifier)
    with pytest.raises(scram.ScramError, match="channel binding"):
        scram.final(final.replace(b"c=biws", b"c=eSws"), scram.read_state(state), verifier)


@pytest.mark.parametrize(
    "message",
    [b"p=tls-unique,,n=u,r=x", b"n,,r=x", b"n,,n=u", b"n,,n=u=2X,r=x", b"x" * 2000, b"\xff"],
)
def test_malformed_client_first_is_refused(message: bytes) -> None:
    with pytest.raises(scram.ScramError):
        scram.parse_client_first(message)


def test_decoy_verifier_is_stable_per_name_and_matches_nothing() -> None:
    a = scram.decoy_verifier("SCRAM-SHA-256", "t/ghost", b"k")
    b = scram.decoy_verifier("SCRAM-SHA-256", "t/ghost", b"k")
    assert a.salt == b.salt and a.iterations == scram.DEFAULT_ITERATIONS
    assert scram.decoy_verifier("SCRAM-SHA-256", "t/other", b"k").salt != a.salt


def test_credentials_text_round_trips_and_reads_old_hashes() -> None:
    creds = create("pw", "bcrypt", ["hash", "scram-sha-512"])
    assert creds.password_hash.startswith("$2b$") and list(creds.scram) == ["SCRAM-SHA-512"]
    assert parse(creds.encode()) == creds
    assert parse("$argon2id$v=19$x") == Credentials("$argon2id$v=19$x", {})
    scram_only = create("pw", "argon2", ["scram-sha-256"])
    assert scram_only.password_hash == "" and parse(scram_only.encode()) == scram_only
    with pytest.raises(ValueError, match="unknown credential"):
        create("pw", "argon2", ["md5"])
