"""DiLoCo and Streaming DiLoCo across datacenters against DDP over the WAN: the same GPT-style model and data,
three ways of synchronising. Plain torch: runs under `testbed launch` or torchrun alike.

    for m in ddp diloco streaming; do
      sudo .venv/bin/testbed launch experiments/emu-3dc-topology.yaml --out results/diloco \\
          -- python examples/diloco.py --method $m
    done
    .venv/bin/python examples/compare_loss.py results/diloco --target 2.0

- ddp: torch's DistributedDataParallel over every rank: the gradients cross the WAN at every step.
- diloco (Douillard et al., 2023): each DC trains its own copy with DDP inside the DC (inner AdamW
  steps); every H steps the DCs average how far they moved (the outer gradient, the start of the
  round minus where they got) over the WAN and apply it with Nesterov momentum (the outer step).
  The outer all-reduce is sharded: host j of each DC averages the j-th slice, then the DC gathers
  the slices, so each host carries 1/hosts of the bytes over the WAN.
- streaming (Douillard et al., 2025): the model's transformer blocks are split into F strided fragments
  (`--fragments`); fragment f syncs every H steps at its own offset, its outer gradient quantised to
  `--outer-bits` (4: two values a byte, one scale per shard) and gathered across DCs while the next
  tau inner steps (`--overlap`) run; then its outer step, and the fragment restarts from the result.

Any number of DCs: $TESTBED_DCS (testbed launch sets it), else `--dcs`; ranks come in contiguous blocks per
DC (testbed launch does this). Rank 0 evaluates its model on held-out batches every H steps (no
communication; for diloco the synchronised model) and writes OUT/<method>.csv
(method, step, wall_s, loss, eval_loss, scale), OUT being --out or $TESTBED_OUT; scale is the WAN's k
(TESTBED_SCALE, see wan_scale).
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import torch
import torch.distributed as dist
from tiny_gpt import Block, say_scale, wan_scale
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class GPT(nn.Module):
    def __init__(self, a) -> None:
        super().__init__()
        torch.manual_seed(1234)  # every rank starts from the same weights
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Parameter(torch.zeros(a.seq, a.hidden))
        self.blocks = nn.Sequential(*(Block(a.hidden, a.heads) for _ in range(a.layers)))
        self.head = nn.Sequential(nn.LayerNorm(a.hidden), nn.Linear(a.hidden, a.vocab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(x) + self.pos))


def batch(a, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences that step through the vocabulary with a per-sequence stride; next-token targets."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, a.vocab, (a.batch, 1), generator=g)
    stride = torch.randint(1, 4, (a.batch, 1), generator=g)
    toks = (start + stride * torch.arange(a.seq + 1)) % a.vocab
    return toks[:, :-1], toks[:, 1:]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, vocab: int) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))


def fragment_of(name: str, fragments: int, layers: int) -> int:
    """Strided fragments (Streaming DiLoCo): block k is in fragment k mod F; the embedding goes with the first
    block, the head with the last."""
    if name.startswith("blocks."):
        return int(name.split(".")[1]) % fragments
    return 0 if name.startswith(("embed", "pos")) else (layers - 1) % fragments


def encode(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` as bytes on the wire: `bits` per value (4: symmetric levels -7..7, two a byte; 8: -127..127; 16: bf16;
    32: fp32), and its scale."""
    if bits >= 16:
        return x.to(torch.bfloat16 if bits == 16 else torch.float32).contiguous().view(torch.uint8), torch.ones(1)
    top = 2 ** (bits - 1) - 1
    scale = x.abs().max().clamp(min=1e-12).reshape(1) / top
    q = torch.round(x / scale).clamp(-top, top).to(torch.int16) + top
    if bits == 4:
        q = torch.nn.functional.pad(q, (0, q.numel() % 2))
        return (q[0::2] * 16 + q[1::2]).to(torch.uint8), scale
    return q.to(torch.uint8), scale


def decode(b: torch.Tensor, scale: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    if bits >= 16:
        return b.view(torch.bfloat16 if bits == 16 else torch.float32).float()[:n]
    top = 2 ** (bits - 1) - 1
    q = b.to(torch.int16)
    if bits == 4:
        q = torch.stack([q // 16, q % 16], 1).reshape(-1)
    return (q[:n] - top).float() * scale


class Fragment:
    """Parameters synced together: their outer copy and Nesterov optimizer, and the sync in flight."""

    def __init__(self, params: list[torch.Tensor], outer_lr: float, momentum: float) -> None:
        self.local = params
        self.glob = [q.detach().clone() for q in params]
        self.outer = torch.optim.SGD(self.glob, lr=outer_lr, momentum=momentum, nesterov=True)
        self.pending = None  # (step it is applied at, gather handles, payloads, scales, numel)


def start_sync(fr: Fragment, step: int, tau: int, bits: int, hosts: int, host: int, cross, dcs: int) -> None:
    """Gather this host's shard of the fragment's quantised outer gradient from every DC, in the background."""
    flat = torch._utils._flatten_dense_tensors([g - p.detach() for g, p in zip(fr.glob, fr.local, strict=True)])
    n = -(-flat.numel() // hosts)
    shard = torch.nn.functional.pad(flat, (0, n * hosts - flat.numel()))[host * n:(host + 1) * n]
    if bits == 32:  # unquantised: summed on the way (a ring all-reduce carries 2 (D - 1) / D of it, a gather D - 1)
        shard = shard.clone()
        fr.pending = (step + tau, [dist.all_reduce(shard, group=cross, async_op=True)], [shard], None, n, flat.numel())
        return
    payload, scale = encode(shard, bits)
    payloads = [torch.empty_like(payload) for _ in range(dcs)]
    scales = [torch.empty_like(scale) for _ in range(dcs)]
    works = [dist.all_gather(payloads, payload, group=cross, async_op=True),
             dist.all_gather(scales, scale, group=cross, async_op=True)]  # over the WAN: host j of every DC
    fr.pending = (step + tau, works, payloads, scales, n, flat.numel())


def finish_sync(fr: Fragment, bits: int, hosts: int, dc_group) -> None:
    """Wait for the gather, average, gather the DC's shards, outer step; the fragment restarts from it."""
    _step, works, payloads, scales, n, numel = fr.pending
    fr.pending = None
    for w in works:
        w.wait()
    if scales is None:
        shard = payloads[0] / dist.get_world_size() * hosts  # the sum over DCs, averaged
    else:
        shard = sum(decode(b, sc, bits, n) for b, sc in zip(payloads, scales, strict=True)) / len(payloads)
    parts = [torch.empty_like(shard) for _ in range(hosts)]
    dist.all_gather(parts, shard, group=dc_group)  # inside the DC
    like = [g.detach() for g in fr.glob]
    avg = torch._utils._unflatten_dense_tensors(torch.cat(parts)[:numel], like)
    for g, d in zip(fr.glob, avg, strict=True):
        g.grad = d
    fr.outer.step()
    with torch.no_grad():
        for g, p in zip(fr.glob, fr.local, strict=True):
            p.copy_(g)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=["diloco", "streaming", "ddp"], required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--inner-steps", type=int, default=10, help="H: inner steps between outer steps (diloco)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (ddp, and diloco's inner steps)")
    p.add_argument("--fragments", type=int, default=2, help="F: fragments synced in turn (streaming)")
    p.add_argument("--overlap", type=int, default=1, help="tau: inner steps a fragment's sync overlaps (streaming)")
    p.add_argument("--outer-bits", type=int, choices=[4, 8, 16, 32], default=None,
                   help="bits per outer-gradient value on the WAN (default: diloco 32, streaming 4)")
    p.add_argument("--dcs", type=int, default=1, help="DCs, when $TESTBED_DCS is not set (torchrun)")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--out", default=os.environ.get("TESTBED_OUT", "results/diloco"))
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dcs = len([d for d in os.environ.get("TESTBED_DCS", "").split(",") if d]) or a.dcs
    if world % dcs:
        raise SystemExit(f"{world} ranks do not split evenly over {dcs} DCs")
    hosts = world // dcs  # ranks per DC
    dc, host = rank // hosts, rank % hosts
    dc_groups = [dist.new_group([d * hosts + j for j in range(hosts)]) for d in range(dcs)]
    cross_groups = [dist.new_group([d * hosts + j for d in range(dcs)]) for j in range(hosts)]

    model = GPT(a)
    streaming = a.method == "streaming"
    F, tau = (a.fragments, a.overlap) if streaming else (1, 0)
    bits = a.outer_bits or (4 if streaming else 32)
    if a.inner_steps % F or (streaming and tau >= a.inner_steps // F):
        raise SystemExit(f"--fragments {F} must divide --inner-steps {a.inner_steps} with --overlap below "
                         f"inner_steps/fragments")
    frags: list[Fragment] = []
    if a.method == "ddp":
        net = DDP(model)  # every rank, across the WAN
    else:
        net = DDP(model, process_group=dc_groups[dc])  # inner steps: data parallel inside the DC
        named = list(model.named_parameters())
        frags = [Fragment([q for n, q in named if fragment_of(n, F, a.layers) == f], a.outer_lr, a.outer_momentum)
                 for f in range(F)]
        frags = [fr for fr in frags if fr.local]
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    held_out = [batch(a, 10**9 + i) for i in range(4)]
    rows: list[tuple] = []
    k = wan_scale()
    if rank == 0:
        say_scale(k)
    dist.barrier()  # the clock starts when every rank is ready
    t0 = time.perf_counter()
    for step in range(1, a.steps + 1):
        x, y = batch(a, 1_000_003 * rank + step)
        opt.zero_grad()
        loss = loss_of(net, x, y, a.vocab)
        loss.backward()
        opt.step()
        for f, fr in enumerate(frags):  # fragment f syncs at step (f + 1) H / F - tau of each round of H
            if fr.pending is not None and fr.pending[0] == step:
                finish_sync(fr, bits, hosts, dc_groups[dc])
            if (step + tau) % a.inner_steps == (f + 1) * a.inner_steps // len(frags) % a.inner_steps:
                start_sync(fr, step, tau, bits, hosts, host, cross_groups[host], dcs)
                if tau == 0:
                    finish_sync(fr, bits, hosts, dc_groups[dc])
        if rank == 0:
            ev = ""
            if step % a.inner_steps == 0:  # held-out loss every H steps (diloco: the synchronised model)
                with torch.no_grad():
                    ev = round(sum(loss_of(model, hx, hy, a.vocab).item() for hx, hy in held_out) / len(held_out), 6)
            rows.append((a.method, step, round(time.perf_counter() - t0, 6), round(loss.item(), 6), ev, k))
            if ev != "":
                print(f"{a.method} step {step} wall {rows[-1][2]:.2f} s held-out loss {ev:.4f}", flush=True)
    for fr in frags:  # syncs still in flight when the steps ran out
        if fr.pending is not None:
            finish_sync(fr, bits, hosts, dc_groups[dc])
    if rank == 0:
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, f"{a.method}.csv")
        with open(path + ".tmp", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["method", "step", "wall_s", "loss", "eval_loss", "scale"])
            w.writerows(rows)
        os.replace(path + ".tmp", path)
        print(f"{a.method}: {a.steps} steps in {rows[-1][2]:.1f} s; wrote {path}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
