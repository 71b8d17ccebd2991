"""Gantt charts: stages x time for one replica and one iteration, with each stage's WAN sends and
receives on lanes of their own, and the simulated and emulated runs of the same configuration drawn
for the same iteration on one time axis.

timeline.csv does not name a transfer's peer; the pipeline does: a stage sends activations forward
and gradients backward, and for one microbatch the activation always moves before the gradient
(forward precedes backward on every stage). So stage 0 only sends forward and receives gradients,
the last stage only sends gradients back and receives activations, and a middle stage's first send
(receive) of a microbatch goes to (comes from) the next (previous) stage.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from testbed.figures.style import KIND_COLOURS, plt, save

COMPUTE_KINDS = ("fwd", "bwd", "allreduce", "optimizer", "prefill")
KIND_NAMES = {"fwd": "forward", "bwd": "backward", "allreduce": "gradient all-reduce", "optimizer": "optimizer step",
              "prefill": "prefill (BubbleTea)"}


def with_peers(tl: pd.DataFrame) -> pd.DataFrame:
    """send/recv rows with `peer` (the other stage) and `grad` (True for a gradient moving backward)."""
    x = tl[tl.kind.isin(["send", "recv"])].copy()
    if x.empty:
        return x.assign(peer=pd.Series(dtype=int), grad=pd.Series(dtype=bool))
    last = x.groupby(["run_id", "source"]).stage.transform("max").clip(lower=1)
    last = np.maximum(last, tl.groupby(["run_id", "source"]).stage.transform("max").reindex(x.index))
    x = x.sort_values(["start_s", "end_s"], kind="stable")
    order = x.groupby(["run_id", "source", "iteration", "replica", "stage", "microbatch", "kind"]).cumcount()
    first = order.reindex(x.index) == 0
    s = x.stage
    send = x.kind == "send"
    # sends: stage 0 -> forward; last stage -> backward; middle: first forward, then backward
    fwd_send = send & ((s == 0) | ((s < last.reindex(x.index)) & first))
    # receives: stage 0 <- gradient; last stage <- activation; middle: first the activation, then the gradient
    act_recv = ~send & ((s == last.reindex(x.index)) | ((s > 0) & first))
    grad = ~(fwd_send | act_recv)
    peer = np.where(send, np.where(fwd_send, s + 1, s - 1), np.where(act_recv, s - 1, s + 1))
    return x.assign(peer=peer.astype(int), grad=grad.to_numpy()).sort_index()


def wan_transfers(tl: pd.DataFrame) -> pd.DataFrame:
    """The send/recv rows whose peer stage is in another DC (same run, source and replica)."""
    x = with_peers(tl)
    if x.empty:
        return x
    where = tl.groupby(["run_id", "source", "replica", "stage"]).dc.first()
    keys = pd.MultiIndex.from_arrays([x.run_id, x.source, x.replica, x.peer])
    x = x.assign(peer_dc=where.reindex(keys).to_numpy())
    return x[x.peer_dc.notna() & (x.peer_dc != x.dc)]


def common_iteration(tl: pd.DataFrame, run_id: str) -> int:
    """The first iteration every source of this run has (emulated timelines start at 1: iteration 0 is
    connection set-up and slow start, so the simulated chart is drawn for iteration 1 as well)."""
    d = tl[tl.run_id == run_id]
    sets = [set(g.iteration) for _, g in d.groupby("source")]
    common = set.intersection(*sets) if sets else set()
    return int(min(common)) if common else int(d.iteration.min())


def lanes(d: pd.DataFrame, wan: pd.DataFrame) -> list[tuple[str, int, str]]:
    """(kind of lane, stage, label) top to bottom: each stage's compute lane, then its WAN lanes."""
    out = []
    dcs = d.groupby("stage").dc.first()
    for s in sorted(d.stage.unique()):
        out.append(("compute", s, f"s{s} ({dcs[s]})"))
        w = wan[wan.stage == s]
        for kind, word in (("send", "sends"), ("recv", "receives")):
            k = w[w.kind == kind]
            if len(k):
                peers = ", ".join(f"s{p}" for p in sorted(k.peer.unique()))
                arrow = "to" if kind == "send" else "from"
                out.append((kind, s, f"s{s}: WAN {word} {arrow} {peers}"))
    return out


def gantt(tl: pd.DataFrame, run_id: str, path: Path, replica: int = 0, iteration: int | None = None,
          allreduce_over_wan: bool = False) -> Path:
    """One panel per source (simulated, emulated) of `run_id`, same iteration, same time axis.
    `allreduce_over_wan`: the replicas sit in different DCs, so the all-reduce bars include WAN time."""
    names = {**KIND_NAMES, "allreduce": "gradient all-reduce (across DCs: WAN time included)"} if allreduce_over_wan \
        else KIND_NAMES
    it = common_iteration(tl, run_id) if iteration is None else iteration
    d_all = tl[(tl.run_id == run_id) & (tl.replica == replica) & (tl.iteration == it)]
    sources = [s for s in ("sim", "emu") if s in set(d_all.source)] + sorted(set(d_all.source) - {"sim", "emu"})
    wan_all = wan_transfers(tl[(tl.run_id == run_id) & (tl.replica == replica)])
    wan_all = wan_all[wan_all.iteration == it]
    per = []
    for src in sources:
        d = d_all[d_all.source == src]
        t0 = d.start_s.min()
        per.append((src, d, wan_all[wan_all.source == src], t0, lanes(d, wan_all[wan_all.source == src])))
    nl = [len(p[4]) for p in per]
    fig, axes = plt.subplots(len(per), 1, figsize=(11, sum(0.26 * n + 0.9 for n in nl) + 0.8), dpi=120,
                             sharex=True, squeeze=False, height_ratios=[max(n, 1) for n in nl], layout="constrained")
    handles: dict[str, object] = {}
    for ax, (src, d, wan, t0, ls) in zip(axes[:, 0], per, strict=True):
        ypos = {(kind, s): i for i, (kind, s, _l) in enumerate(ls)}
        for kind in COMPUTE_KINDS:
            k = d[d.kind == kind]
            for s, ks in k.groupby("stage"):
                y = ypos[("compute", s)]
                h = ax.broken_barh(list(zip(ks.start_s - t0, ks.end_s - ks.start_s, strict=True)), (y - 0.4, 0.8),
                                   color=KIND_COLOURS[kind])
                handles.setdefault(names[kind], h)
        for kind, word in (("send", "WAN send (until its last byte leaves)"),
                           ("recv", "WAN receive (until its last byte arrives)")):
            for (s, grad), ks in wan[wan.kind == kind].groupby(["stage", "grad"]):
                y = ypos[(kind, s)]
                h = ax.broken_barh(list(zip(ks.start_s - t0, ks.end_s - ks.start_s, strict=True)), (y - 0.3, 0.6),
                                   facecolor=KIND_COLOURS[kind], alpha=0.55, edgecolor=KIND_COLOURS[kind],
                                   linewidth=0.4, hatch="////" if grad else None)
                handles.setdefault(word, h)
                if grad:
                    handles.setdefault("hatched: gradient (backward)", h)
        for i, (kind, _s, _l) in enumerate(ls):
            if kind != "compute":
                ax.axhspan(i - 0.5, i + 0.5, color="#F4F4F8", zorder=0)
        ax.set_yticks(range(len(ls)), [lbl for *_x, lbl in ls], fontsize=7)
        ax.set_ylim(len(ls) - 0.5, -0.5)
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_title(f"{'simulated' if src == 'sim' else 'emulated (measured)' if src == 'emu' else src}: "
                     f"iteration {it} ({(d.end_s.max() - t0):.3g} s)", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time since the iteration's start (s)")
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", fontsize=7,
               ncol=min(4, len(handles)))
    fig.suptitle(f"{run_id}: replica {replica}, iteration {it}. White on a stage's lane = bubble; "
                 f"intra-DC transfers not drawn", fontsize=9)
    save(fig, path, tight=False)
    return path
