"""Pausing the cyclic garbage collector around a bulk load of long-lived objects.

Filling a route table makes millions of containers (trie nodes, dicts, keys) that live as
long as the process and form no cycles. With the collector on, every full collection
during the fill re-walks everything made so far: for 1,000,000 subscriptions that cost as
much again as the fill itself (bench/boot.py). Use it only around code that does not
await, so that nothing else runs while the collector is off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
