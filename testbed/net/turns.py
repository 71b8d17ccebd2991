"""The order in which transfers take turns on a WAN link under temporal sharing: one key, used by the
simulator (sim/executor.py) and by the Atlas sidecar on the emulated WAN (runtime/sidecar.py). Ground floor
(standard library only), so the role processes need nothing of the plan.

A key is a tuple; the transfer with the smallest key goes first, the next fills what it leaves. A pipe
(one stage boundary's connections) carries its transfers in order, so only its head is ranked.
"""

from __future__ import annotations

from collections.abc import Callable

TurnKey = Callable[[int, int, str, float], tuple]


def by_microbatch(microbatch: int, turn: int, kind: str, issued: float) -> tuple:
    """Earliest microbatch first (it gates the earliest compute downstream), then the replica's turn.
    A newly issued earlier microbatch preempts a later one in flight."""
    return (microbatch, turn, kind)


def first_come(microbatch: int, turn: int, kind: str, issued: float) -> tuple:
    """First come, first served: the transfer issued first goes first, whoever's it is."""
    return (issued, turn, microbatch)


def by_replica(microbatch: int, turn: int, kind: str, issued: float) -> tuple:
    """A fixed replica order: the first replica in the plan's turn order with a transfer pending goes first."""
    return (turn, microbatch, kind)


# network.turn_order picks one, or `auto` (plan/build.py turn_policy); bench/turn_orders.py compares them
TURN_KEYS: dict[str, TurnKey] = {"replica": by_replica, "fcfs": first_come, "microbatch": by_microbatch}
