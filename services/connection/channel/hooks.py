"""DeliveryHooks: how a connection's outbound bandwidth gate (services/connection/budget.py
DeliveryGate) reaches the connection it was made for, handed to the gate when it is made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # budget.py imports the channel package
    from services.connection.budget import DeliveryGate


@dataclass(frozen=True, slots=True)
class DeliveryHooks:
    """`wake`: a lease answered while the gate waited (the connection retries what it
    holds); `attach`: put the gate on (itself) or off (None) the connection's delivery
    path."""

    wake: Callable[[], None]
    attach: Callable[[DeliveryGate | None], None]


NO_HOOKS = DeliveryHooks(wake=lambda: None, attach=lambda gate: None)
