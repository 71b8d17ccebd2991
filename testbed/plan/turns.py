"""The turn orders on a WAN link: testbed/net/turns.py (ground floor, so that the sidecar needs nothing of
the plan), re-exported for the plan's users."""

from testbed.net.turns import TURN_KEYS, TurnKey, by_microbatch, by_replica, first_come  # noqa: F401
