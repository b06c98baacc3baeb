"""The per-rule dead-letter store: outputs an action could not deliver after its retries, kept
durably so an operator can list, replay or purge them. Importers use this module; the parts
live by job:

- dead_letter_store.py: the contract (`DeadLetterStore`, `DeadLetter`, `DeadLetterLimits`)
  and the retention rule: each rule's letters are bounded by count and bytes; past either
  bound the oldest are dropped and the drop is counted, so a target that stays down cannot
  fill the disk;
- dead_letter_replay.py: letters handed back to their actions (`ReplayResult`);
- dead_letter_codec.py: the stored form of a letter and its size;
- sqlite_dead_letters.py (`SqliteDeadLetters`, the default: a file under the rules service's
  data directory) and cassandra_dead_letters.py (`CassandraDeadLetters`, for a mesh on
  Cassandra): two backends with one contract.
"""

from __future__ import annotations

from services.rules.actions.cassandra_dead_letters import CassandraDeadLetters
from services.rules.actions.dead_letter_codec import decode_output, encode_output
from services.rules.actions.dead_letter_replay import REPLAY_CHUNK, ReplayResult, SendFn
from services.rules.actions.dead_letter_store import (
    DeadLetter,
    DeadLetterLimits,
    DeadLetterStats,
    DeadLetterStore,
)
from services.rules.actions.sqlite_dead_letters import SqliteDeadLetters

__all__ = [
    "REPLAY_CHUNK",
    "CassandraDeadLetters",
    "DeadLetter",
    "DeadLetterLimits",
    "DeadLetterStats",
    "DeadLetterStore",
    "ReplayResult",
    "SendFn",
    "SqliteDeadLetters",
    "decode_output",
    "encode_output",
]
