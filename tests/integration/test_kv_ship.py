"""The modeled emulated BubbleTea run with `bubbletea.ship_kv`: each bubble-served request's KV cache (its modeled
size over k) crosses the emulated WAN to its home DC's decode process; arrivals are measured, caches still in flight
at the end are counted, and nothing is left behind. Prefix gdtbk6."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.integration.conftest import cli
from tests.integration.test_bubbletea_online import ours, rows


def test_modeled_run_ships_kv_caches_to_their_home_dc(tmp_path):
    before = ours("gdtbk6")
    r = cli("experiment", "run", str(ROOT / "experiments" / "emu-bubbletea.yaml"), "--out", str(tmp_path),
            "--set", "schedulers=[atlas+bubbletea]", "--set", "iterations=3", "--set", "bubbletea.ship_kv=true",
            "--set", "emulation.prefix=gdtbk6")
    assert r.returncode == 0, r.stderr
    emu = next(x for x in rows(tmp_path / "summary.csv") if x["source"] == "emu")
    reqs = [x for x in rows(tmp_path / "requests.csv") if x["source"] == "emu" and x["in_bubble"] == "1"]
    arrived = [x for x in reqs if x["kv_ready_s"] != ""]
    wan_reqs = [x for x in reqs if x["dc"] != x["home_dc"]]  # a cache whose home is its own DC is not shipped
    assert arrived and len(wan_reqs) - len(arrived) == int(emu["kv_not_arrived"])
    assert all(x["dc"] != x["home_dc"] for x in arrived)
    for x in arrived:  # a cache leaves after its prefill ends (TTFT stays the prefill's end, as in the simulator)
        assert float(x["kv_ready_s"]) > float(x["end_s"])
    wan = [x for x in arrived if x["dc"] != x["home_dc"]]
    assert wan and int(emu["kv_wan_bytes"]) >= sum(int(x["kv_bytes"]) for x in wan)
    assert float(emu["kv_ship_p50_ms"]) > 0
    assert ours("gdtbk6") == before
