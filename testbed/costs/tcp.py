"""TCP window model: one connection carries at most window/RTT; Atlas stripes over n connections."""

from __future__ import annotations

import math


def per_connection_bps(window_bytes: float, rtt_s: float) -> float:
    """Bytes/s one TCP connection sustains with a window cap (infinite at zero RTT)."""
    return math.inf if rtt_s <= 0 else window_bytes / rtt_s


def connections_for(capacity_bps: float, window_bytes: float, rtt_s: float, max_connections: int) -> int:
    """Fewest connections whose windows cover the bandwidth-delay product, capped at max_connections."""
    if rtt_s <= 0:
        return 1
    return max(1, min(max_connections, math.ceil(capacity_bps * rtt_s / window_bytes)))


def striped_rate(capacity_bps: float, connections: int, window_bytes: float, rtt_s: float) -> float:
    """Rate of one transfer striped over n connections, alone on the link: min(C, n W/RTT)."""
    return min(capacity_bps, connections * per_connection_bps(window_bytes, rtt_s))
