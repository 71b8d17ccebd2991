"""DiLoCo across datacenters against DDP over the WAN: the same GPT-style model and data, two ways
of synchronising. Plain torch: runs under `testbed launch` or torchrun alike.

    sudo .venv/bin/testbed launch experiments/emu-3dc-topology.yaml --out results/diloco \\
        -- python examples/diloco.py --method ddp
    sudo .venv/bin/testbed launch experiments/emu-3dc-topology.yaml --out results/diloco \\
        -- python examples/diloco.py --method diloco
    .venv/bin/python examples/compare_loss.py results/diloco --target 2.0

- ddp: torch's DistributedDataParallel over every rank: the gradients cross the WAN at every step.
- diloco (Douillard et al., 2023): each DC trains its own copy with DDP inside the DC (inner AdamW
  steps); every H steps the DCs average how far they moved (the outer gradient, the start of the
  round minus where they got) over the WAN and apply it with Nesterov momentum (the outer step).
  The outer all-reduce is sharded: host j of each DC averages the j-th slice, then the DC gathers
  the slices, so each host carries 1/hosts of the bytes over the WAN.

Ranks come in contiguous blocks per DC (testbed launch does this). Rank 0 evaluates the synchronised
model on held-out batches every H steps (no communication) and writes OUT/<method>.csv
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
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


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


def outer_step(local: list[torch.Tensor], glob: list[torch.Tensor], outer: torch.optim.Optimizer, hosts: int,
               host: int, cross_group, dc_group, dcs: int) -> None:
    """Average the DCs' outer gradients (sharded over the DC's hosts), Nesterov step, restart from it."""
    deltas = [g - p.detach() for g, p in zip(glob, local, strict=True)]
    flat = torch._utils._flatten_dense_tensors(deltas)
    n = -(-flat.numel() // hosts)
    flat = torch.nn.functional.pad(flat, (0, n * hosts - flat.numel()))
    shard = flat[host * n:(host + 1) * n].clone()
    dist.all_reduce(shard, group=cross_group)  # over the WAN: host j of every DC
    shard /= dcs
    parts = [torch.empty_like(shard) for _ in range(hosts)]
    dist.all_gather(parts, shard, group=dc_group)  # inside the DC
    avg = torch._utils._unflatten_dense_tensors(torch.cat(parts)[:sum(d.numel() for d in deltas)], deltas)
    for g, d in zip(glob, avg, strict=True):
        g.grad = d
    outer.step()
    with torch.no_grad():
        for g, p in zip(glob, local, strict=True):
            p.copy_(g)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=["diloco", "ddp"], required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--inner-steps", type=int, default=10, help="H: inner steps between outer steps (diloco)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (ddp, and diloco's inner steps)")
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
    dcs = max(1, len([d for d in os.environ.get("TESTBED_DCS", "").split(",") if d]))
    if world % dcs:
        raise SystemExit(f"{world} ranks do not split evenly over {dcs} DCs")
    hosts = world // dcs  # ranks per DC
    dc, host = rank // hosts, rank % hosts
    dc_groups = [dist.new_group([d * hosts + j for j in range(hosts)]) for d in range(dcs)]
    cross_groups = [dist.new_group([d * hosts + j for d in range(dcs)]) for j in range(hosts)]

    model = GPT(a)
    if a.method == "ddp":
        net = DDP(model)  # every rank, across the WAN
    else:
        net = DDP(model, process_group=dc_groups[dc])  # inner steps: data parallel inside the DC
        glob = [q.detach().clone() for q in model.parameters()]
        outer = torch.optim.SGD(glob, lr=a.outer_lr, momentum=a.outer_momentum, nesterov=True)
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
        synced = a.method == "ddp" or step % a.inner_steps == 0
        if a.method == "diloco" and synced:
            outer_step(list(model.parameters()), glob, outer, hosts, host, cross_groups[host], dc_groups[dc], dcs)
        if rank == 0:
            ev = ""
            if synced and step % a.inner_steps == 0:  # the synchronised model on held-out data
                with torch.no_grad():
                    ev = round(sum(loss_of(model, hx, hy, a.vocab).item() for hx, hy in held_out) / len(held_out), 6)
            rows.append((a.method, step, round(time.perf_counter() - t0, 6), round(loss.item(), 6), ev, k))
            if ev != "":
                print(f"{a.method} step {step} wall {rows[-1][2]:.2f} s held-out loss {ev:.4f}", flush=True)
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
