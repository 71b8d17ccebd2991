"""Sizing a run to the machine (testbed/emu/headroom.py): a short probe, k from its headroom, an explicit k kept
with a warning where it will not hold, and a warning about workers whose timing the machine will not keep."""

from __future__ import annotations

from dataclasses import replace

import pytest

from testbed.emu.headroom import LOW_MBPS, Headroom, probe, size, target_mbps, worker_warning
from testbed.emu.scale import TARGET_MBPS
from testbed.spec.load import load_topology
from tests.conftest import ROOT

QUIET = Headroom(cpus=2, busy_share=0.0, steal_share=0.0, runnable_per_cpu=0.1, wake_late_mean_s=60e-6,
                 wake_late_p90_s=80e-6, probe_s=1.0)
BUSY = replace(QUIET, busy_share=0.9, runnable_per_cpu=3.0)
LATE = replace(QUIET, wake_late_mean_s=2e-3)


def test_the_probe_is_short_and_measures_the_machine():
    h = probe(0.2)
    # it lasts its duration; the upper bound only catches a probe that runs away (a loaded machine stretched
    # 0.2 s past 0.5 s in the suite, so a tight bound here timed the machine, not the probe)
    assert 0.2 <= h.probe_s < 10
    assert h.cpus >= 1 and 0 <= h.busy_share <= 1 and 0 <= h.free_cpus <= h.cpus
    assert h.wake_late_mean_s >= 0 and h.wake_late_p90_s >= 0


def test_less_headroom_runs_the_links_slower():
    assert target_mbps(QUIET) == TARGET_MBPS
    assert target_mbps(BUSY) == LOW_MBPS
    assert target_mbps(LATE) == LOW_MBPS, "timers that wake late: the low end, whatever the CPUs"
    half = replace(QUIET, busy_share=0.625)  # 0.75 free CPUs: half-way
    assert LOW_MBPS < target_mbps(half) < TARGET_MBPS


def test_auto_k_follows_the_headroom_and_an_explicit_k_wins_with_a_warning():
    topo = load_topology(ROOT / "topologies" / "3dc.yaml")
    fastest_mbps = max(link.gbps for link in topo.links) * 1e3
    quiet, busy = size(topo, QUIET, None), size(topo, BUSY, None)
    assert busy.scale > quiet.scale and not quiet.warnings and not busy.warnings
    assert fastest_mbps / busy.scale == pytest.approx(LOW_MBPS, rel=1e-3)
    mine = size(topo, BUSY, quiet.scale)
    assert mine.scale == quiet.scale, "the user's k is kept"
    assert len(mine.warnings) == 1 and "would hold" in mine.warnings[0]
    assert not size(topo, QUIET, quiet.scale).warnings


def test_workers_are_warned_about_when_their_timing_will_not_hold():
    assert worker_warning(QUIET, pp=3, dp=2, microbatches=8, wan_boundaries=2, iteration_s=1.0, limit=0.05) == ""
    w = worker_warning(LATE, pp=3, dp=2, microbatches=8, wan_boundaries=2, iteration_s=0.2, limit=0.05)
    assert "6 workers" in w and "budget" in w
    assert "free CPUs" in worker_warning(BUSY, pp=3, dp=2, microbatches=8, wan_boundaries=2, iteration_s=1.0,
                                         limit=0.05)
