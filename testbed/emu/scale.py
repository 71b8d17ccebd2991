"""Choosing the emulation scale factor k (DESIGN.md: emulated links at 100-200 Mbit/s)."""

from __future__ import annotations

from testbed.spec.topology import Topology

TARGET_MBPS = 200.0


def auto_scale(topo: Topology) -> float:
    """The smallest k that brings the fastest WAN link down to 200 Mbit/s (1 if it already is)."""
    fastest = max((link.gbps * 1e3 for link in topo.links), default=0.0)
    return max(1.0, fastest / TARGET_MBPS)
