"""A small Llama-style causal LM for real prefill and decode on the CPU (random weights): RMSNorm,
rotary position embeddings, grouped-query attention with a KV cache, a SwiGLU MLP. Every process
that builds it with the same shape and seed gets the same weights, so a decode process can continue
from a KV cache that a worker's prefill made.

Its shape is `tiny-llama` in the model zoo (testbed/costs/models.py), so the cost model counts its
FLOPs and KV bytes like any other model's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from testbed.costs.models import ModelConfig

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each (kv_heads, tokens, head_dim)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def rotate(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (heads, tokens, head_dim) at absolute positions `pos` (tokens,)."""
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, m: ModelConfig) -> None:
        super().__init__()
        self.h, self.kvh, self.hd = m.heads, m.kv_heads, m.head_dim
        self.norm1, self.norm2 = RMSNorm(m.hidden), RMSNorm(m.hidden)
        self.q = nn.Linear(m.hidden, m.heads * m.head_dim, bias=False)
        self.kv = nn.Linear(m.hidden, 2 * m.kv_heads * m.head_dim, bias=False)
        self.o = nn.Linear(m.heads * m.head_dim, m.hidden, bias=False)
        self.up = nn.Linear(m.hidden, 2 * m.ffn_hidden, bias=False)  # gate and up together
        self.down = nn.Linear(m.ffn_hidden, m.hidden, bias=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        steps = self.steps(x, pos, past, block=x.shape[0])
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(self, x: torch.Tensor, pos: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None,
              block: int = 128):
        """The layer in blocks of `block` query tokens (each attends to the cache and the new tokens up to
        it), yielding after each block: a prefill can pause inside a layer. Returns (x, (keys, values))."""
        n = x.shape[0]
        y = self.norm1(x)
        q = rotate(self.q(y).view(n, self.h, self.hd).transpose(0, 1), pos)
        k, v = self.kv(y).view(n, 2, self.kvh, self.hd).permute(1, 2, 0, 3)
        k = rotate(k, pos)
        if past is not None:
            k, v = torch.cat((past[0], k), dim=1), torch.cat((past[1], v), dim=1)
        rep = self.h // self.kvh
        kk, vv = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        cached = kk.shape[1] - n
        outs = []
        for a in range(0, n, block):
            b = min(n, a + block)
            if cached == 0 and a == 0 and b == n:
                att = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
            else:  # rows a..b see every cached token and the new ones up to themselves
                mask = torch.ones(b - a, cached + b, dtype=torch.bool).tril(diagonal=cached + a)
                att = F.scaled_dot_product_attention(q[:, a:b], kk[:, :cached + b], vv[:, :cached + b], attn_mask=mask)
            h = x[a:b] + self.o(att.transpose(0, 1).reshape(b - a, self.h * self.hd))
            gate, up = self.up(self.norm2(h)).chunk(2, dim=-1)
            outs.append(h + self.down(F.silu(gate) * up))
            yield
        return torch.cat(outs), (k, v)


class TinyLlama(nn.Module):
    def __init__(self, m: ModelConfig, seed: int = 1234) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = m
        self.embed = nn.Embedding(m.vocab, m.hidden)
        self.blocks = nn.ModuleList(Block(m) for _ in range(m.layers))
        self.norm = RMSNorm(m.hidden)
        self.head = nn.Linear(m.hidden, m.vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def prefill_steps(self, ids: torch.Tensor, past: KV | None = None, block: int = 128):
        """`prefill` in small steps (a block of query tokens of one layer each): yields after each (a
        caller may pause there and resume later), returns (next token, extended cache) at the end.
        Gradients are off inside each step only: the thread may train between steps."""
        start = past[0][0].shape[1] if past else 0
        pos = torch.arange(start, start + ids.shape[0])
        with torch.no_grad():
            x = self.embed(ids)
        out: KV = []
        for i, blk in enumerate(self.blocks):
            steps = blk.steps(x, pos, past[i] if past else None, block)
            while True:
                try:
                    with torch.no_grad():
                        next(steps)
                except StopIteration as done:
                    x, kv = done.value
                    break
                yield
            out.append(kv)
        with torch.no_grad():
            logits = self.head(self.norm(x[-1:]))  # the first output token needs the last position only
        return int(logits.argmax(-1)), out

    def prefill(self, ids: torch.Tensor, past: KV | None = None) -> tuple[int, KV]:
        """Run `ids` (new tokens) after the cached ones; return the next token and the extended cache."""
        steps = self.prefill_steps(ids, past)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    @torch.no_grad()
    def decode(self, first: int, past: KV, steps: int) -> list[int]:
        """Greedy decode `steps` tokens after `first`, continuing from a prefill's cache."""
        toks, cur = [first], past
        for _ in range(steps):
            nxt, cur = self.prefill(torch.tensor([toks[-1]]), cur)
            toks.append(nxt)
        return toks


def prompt_ids(request_id: int, tokens: int, vocab: int) -> torch.Tensor:
    """A request's prompt: token ids drawn from its id (the trace has lengths, not text)."""
    g = torch.Generator().manual_seed(request_id)
    return torch.randint(0, vocab, (tokens,), generator=g)


def kv_to_bytes(kv: KV) -> bytes:
    return torch.cat([t.reshape(-1) for pair in kv for t in pair]).numpy().tobytes()


def kv_from_bytes(data: bytes | memoryview, m: ModelConfig, tokens: int) -> KV:
    flat = torch.frombuffer(bytearray(data), dtype=torch.float32)
    n = m.kv_heads * tokens * m.head_dim
    parts = flat.split(n)
    return [(parts[2 * i].view(m.kv_heads, tokens, m.head_dim), parts[2 * i + 1].view(m.kv_heads, tokens, m.head_dim))
            for i in range(m.layers)]
