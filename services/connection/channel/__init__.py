"""The per-client MQTT state machine, split by packet family behind one sans-I/O entry point.

Call `Channel.receive(data, now)` and the other `Channel` methods; carry out the actions they
return; write `Channel.out`. Modules (private; import from here):

- core.py           `Channel`: receive, dispatch, a connected client's packets, the shell's calls
- opening.py        CONNECT to CONNACK: authentication, auto-subscriptions, held packets replayed
- closing.py        DISCONNECT, refusals, the client's broken rules, the timers that close
- state.py          `State` and `ChannelBase`, the fields the three modules above share
- handshake.py      CONNECT checks, CONNACK, packets held until the session is known
- inbound.py        PUBLISH from the client, its acks in order, PUBREL/PUBCOMP
- outbound.py       deliveries to the client (window, queue, aliases) and their acks
- subscriptions.py  the client's subscriptions, SUBSCRIBE/UNSUBSCRIBE
- control.py        PINGREQ, the client's DISCONNECT, keep alive, the control-packet budget
- problems.py       Reason Strings: whether a reply may carry one, and its text
- enhanced_auth.py  the AUTH packets of enhanced authentication and re-authentication
- actions.py        what the channel asks its shell to do
- config.py         `ChannelConfig`
"""

from services.connection.channel.actions import (
    Action,
    Authenticate,
    AutoSubscribe,
    Close,
    DeliveryProgress,
    Reauthenticate,
    ReleaseQos2,
    Route,
    SubscribeRequest,
    Unsubscribed,
)
from services.connection.channel.config import ChannelConfig
from services.connection.channel.core import Channel, State
from services.connection.channel.outbound import (
    AWAIT_PUBACK,
    AWAIT_PUBCOMP,
    AWAIT_PUBREC,
    Outbound,
)

__all__ = [
    "AWAIT_PUBACK",
    "AWAIT_PUBCOMP",
    "AWAIT_PUBREC",
    "Action",
    "Authenticate",
    "AutoSubscribe",
    "Channel",
    "ChannelConfig",
    "Close",
    "DeliveryProgress",
    "Outbound",
    "Reauthenticate",
    "ReleaseQos2",
    "Route",
    "State",
    "SubscribeRequest",
    "Unsubscribed",
]
