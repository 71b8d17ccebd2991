"""`compute: torch`: a real GPT-style pipeline stage on the CPU (or the GPU the host is pinned to).

Stage 0 embeds tokens, every stage runs its share of transformer blocks, the last one adds the
output head and the loss. The data is synthetic but learnable (each sequence counts up by one
modulo the vocabulary from a random start), so the loss falls within a few iterations and shows
that real gradients cross the emulated WAN.
"""

from __future__ import annotations

import torch
from torch import nn


class Stage(nn.Module):
    def __init__(self, *, layers: int, hidden: int, heads: int, vocab: int, seq: int, first: bool, last: bool,
                 seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.first, self.last, self.seq = first, last, seq
        self.embed = nn.Embedding(vocab, hidden) if first else None
        self.pos = nn.Parameter(torch.zeros(seq, hidden)) if first else None
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(hidden) if last else None
        self.head = nn.Linear(hidden, vocab) if last else None
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos
        for blk in self.blocks:
            x = blk(x, src_mask=self.mask, is_causal=True)
        if self.last:
            x = self.head(self.norm(x))
        return x


def batch(vocab: int, seq: int, micro: int, *, replica: int, iteration: int, mb: int) -> tuple[torch.Tensor, ...]:
    """Tokens and next-token targets: sequences that count up modulo vocab from a random start."""
    g = torch.Generator().manual_seed(1_000_003 * replica + 1009 * iteration + mb)
    start = torch.randint(0, vocab, (micro, 1), generator=g)
    toks = (start + torch.arange(seq + 1)) % vocab
    return toks[:, :-1], toks[:, 1:]


def to_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().cpu().contiguous().numpy()).cast("B")


def from_bytes(buf: bytes | bytearray, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.frombuffer(bytearray(buf), dtype=torch.float32).reshape(shape).clone()
