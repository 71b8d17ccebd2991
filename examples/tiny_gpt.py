"""What the example jobs share: the emulated WAN's scale k they run under, and a tiny GPT block (causal
self-attention and an MLP). Imported by the scripts beside it (a script's own folder is on its path, under
`testbed launch` as under torchrun)."""

from __future__ import annotations

import os

import torch
from torch import nn


def wan_scale() -> float:
    """The emulated WAN's scale k: testbed launch divides every WAN link's rate and window by k and sets
    TESTBED_SCALE (1 when unset, as under torchrun). This script sends its tensors at their real size, so its
    WAN transfers take up to k times as long as on the spec's WAN (testbed launch prints each link's factor);
    it says so and records k next to its times. examples/ddp_scale.py shows a scale model (bytes / k)."""
    return float(os.environ.get("TESTBED_SCALE", "1"))


def say_scale(k: float) -> None:
    if k != 1:
        print(f"TESTBED_SCALE={k:g}: tensors are sent at their real size, so WAN transfers take up to {k:g}x as "
              f"long as on the spec's WAN; times below are this emulated WAN's, not the real one's", flush=True)


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.attn = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))
