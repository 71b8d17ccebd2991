"""A low-communication plan's sync period as plain data (testbed/plan/diloco.py lowers it): kept apart
from the lowering so that the Plan type can hold it without importing the lowering."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DiLoCoPlan:
    inner_steps: int  # H
    fragments: int  # F
    outer_bits: int  # bits per outer-gradient value on the WAN
    overlap_steps: int  # tau: inner steps a fragment's sync overlaps

    def sync_after(self, f: int) -> int:
        """The inner step (0-based) after which fragment f's sync starts."""
        return (f + 1) * self.inner_steps // self.fragments - 1 - self.overlap_steps

    def wait_before(self, f: int) -> int:
        """The inner step before which fragment f's sync must be done (H: the period's end)."""
        return (f + 1) * self.inner_steps // self.fragments

    def outer_bytes(self, grad_bytes: float) -> float:
        """One fragment's quantised outer gradient of a stage whose bf16 gradient is `grad_bytes`."""
        params = grad_bytes / 2
        return params / self.fragments * self.outer_bits / 8


DEFAULTS = {
    "diloco": DiLoCoPlan(inner_steps=500, fragments=1, outer_bits=16, overlap_steps=0),
    "streaming": DiLoCoPlan(inner_steps=100, fragments=4, outer_bits=4, overlap_steps=1),
}
