"""A WAN that changes, live, on the emulated network (experiments/wan-change.yaml, Atlas only, 6 iterations).

What must hold, whatever the machine's load:
- every scheduled change is applied, in order, no earlier than its time and within half a second of it;
- while the capacity is down to 4 Gbit/s the link never carries much more than that (HTB re-rated): no
  200 ms window above 4 Gbit/s x 1.15 (HTB's 128 KiB burst, scaled back by k = 50, is 0.26 Gbit/s over
  200 ms; a single 20 ms bin may hold a whole burst, so windows, not bins);
- while the link is down it carries nothing (bins wholly inside the outage, after the packets already on
  the wire arrived, below 1 % of its capacity), and afterwards it carries again;
- both engines report a stall on the down link, no longer than the outage plus a bin of slack;
- the run leaves nothing behind.
"""

from __future__ import annotations

import csv

from tests.conftest import ROOT
from tests.integration.conftest import cli, snapshot

PREFIX = "gdtbw3"


def ours(snap: dict[str, set[str]]) -> dict[str, set[str]]:
    """What carries this test's prefix (other people's emulations come and go on this machine meanwhile)."""
    return {k: {x for x in v if PREFIX in x} for k, v in snap.items()}


def rows(path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_changing_wan_applied_live(tmp_path):
    before = ours(snapshot())
    out = tmp_path / "run"
    p = cli("experiment", "run", str(ROOT / "experiments" / "wan-change.yaml"), "--out", str(out),
            "--set", "schedulers=[atlas]", "--set", "iterations=6", "--set", f"emulation.prefix={PREFIX}")
    assert p.returncode == 0, p.stderr[-2000:]
    changes = rows(out / "linkchanges.csv")
    sim = [(r["link"], float(r["t_s"]), r["up"]) for r in changes if r["source"] == "sim"]
    emu = [r for r in changes if r["source"] == "emu"]
    got = [(r["link"], float(r["t_s"]), r["up"]) for r in emu]
    # every change both runs lasted to, in order, in both (the longer run of the two also sees the later ones)
    n = min(len(got), len(sim))
    assert n >= 2 and got[:n] == sim[:n], (got, sim)
    for r in emu:
        assert float(r["t_s"]) - 1e-6 <= float(r["applied_s"]) <= float(r["t_s"]) + 0.5

    rates = [r for r in rows(out / "linkrates.csv") if r["source"] == "emu"]

    def bins(link: str, lo: float, hi: float) -> list[float]:
        return [float(r["gbps"]) for r in rates if r["link"] == link and lo <= float(r["t_s"]) and
                float(r["t_s"]) + 0.03 <= hi]

    def windows(link: str, lo: float, hi: float, width: float = 0.2) -> list[float]:
        """Mean Gbit/s over each `width`-second window of consecutive bins inside [lo, hi]."""
        pts = sorted((float(r["t_s"]), float(r["gbps"])) for r in rates if r["link"] == link)
        spans = [(t, u, g) for (t, g), (u, _) in zip(pts, pts[1:], strict=False) if lo <= t and u <= hi]
        out = []
        for i, (t0, _, _) in enumerate(spans):
            inside = [(u - t, g) for t, u, g in spans[i:] if u <= t0 + width]
            if sum(d for d, _ in inside) >= 0.9 * width:
                out.append(sum(d * g for d, g in inside) / sum(d for d, _ in inside))
        return out

    applied = {(r["link"], float(r["t_s"])): float(r["applied_s"]) for r in emu}
    drop, back = applied[("useast-uscentral", 1.2)], applied[("useast-uscentral", 4.0)]
    slow = windows("useast>uscentral", drop + 0.05, back) + windows("uscentral>useast", drop + 0.05, back)
    assert slow and max(slow) <= 4 * 1.15
    down, up = applied[("uscentral-uswest", 2.6)], applied[("uscentral-uswest", 3.0)]
    dark = bins("uscentral>uswest", down + 0.05, up) + bins("uswest>uscentral", down + 0.05, up)
    assert dark and max(dark) < 0.01 * 10
    assert max(bins("uscentral>uswest", up, up + 2) + bins("uswest>uscentral", up, up + 2)) > 1.0

    stall = {r["source"]: float(r["wan_stall_s"]) for r in rows(out / "summary.csv")}
    assert 0 < stall["sim"] <= 0.4 + 1e-9
    assert 0 < stall["emu"] <= 0.4 + 0.05
    assert ours(snapshot()) == before
