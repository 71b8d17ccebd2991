"""TCP window model: one connection carries at most window/RTT; Atlas stripes over n connections."""

from __future__ import annotations

import math


def per_connection_bytes_s(window_bytes: float, rtt_s: float) -> float:
    """Bytes/s one TCP connection sustains with a window cap (infinite at zero RTT)."""
    return math.inf if rtt_s <= 0 else window_bytes / rtt_s


def connections_for(capacity_bytes_s: float, window_bytes: float, rtt_s: float, max_connections: int) -> int:
    """Fewest connections whose windows cover the bandwidth-delay product, capped at max_connections."""
    if rtt_s <= 0:
        return 1
    return max(1, min(max_connections, math.ceil(capacity_bytes_s * rtt_s / window_bytes)))


def striped_rate(capacity_bytes_s: float, connections: int, window_bytes: float, rtt_s: float) -> float:
    """Rate of one transfer striped over n connections, alone on the link: min(C, n W/RTT)."""
    return min(capacity_bytes_s, connections * per_connection_bytes_s(window_bytes, rtt_s))


def windowed_send_s(nbytes: float, capacity_bytes_s: float, window_bytes: float, rtt_s: float) -> float:
    """Time to put `nbytes` on an idle link of `capacity_bytes_s` (bytes/s) through a window of `window_bytes`
    (all of a transfer's connections together): each round trip a window goes out at the link's rate, and the
    next round starts when the first acknowledgements return, one round trip after the round began. A
    transfer of q windows (q > 1) takes (q - 1) round trips plus one window's time on the link, not q round
    trips (the fluid n W / RTT); a window that fills the round trip (n W >= C RTT) leaves the link busy."""
    if rtt_s <= 0 or window_bytes >= capacity_bytes_s * rtt_s:
        return nbytes / capacity_bytes_s
    rounds = max(0, math.ceil(nbytes / window_bytes) - 1)
    return rounds * rtt_s + (nbytes - rounds * window_bytes) / capacity_bytes_s
