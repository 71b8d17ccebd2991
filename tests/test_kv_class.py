"""The KV caches' HTB class on the emulated WAN (runtime/htb.py kv_class): the simulator's policy in HTB terms."""

from __future__ import annotations

from testbed.bubbletea.emulated import DECODE_PORT
from testbed.emu.shaping import rate_change_commands
from testbed.emu.train import KV_MINOR
from testbed.plan.lower import BASE_PORT
from testbed.runtime.htb import IDLE_PRIO, KV_PRIO, MIN_RATE_BPS, class_args, kv_class, link_mtu


def test_kv_class_is_a_trickle_with_the_link_as_ceiling_last_under_turns():
    for link_bps in (1e5, 8e6, 2e9):
        for temporal, want in ((True, KV_PRIO), (False, IDLE_PRIO)):
            rate, ceil, prio = kv_class(link_bps, temporal)
            assert prio == want and ceil == link_bps
            assert MIN_RATE_BPS <= rate <= max(link_bps / 100, MIN_RATE_BPS)
    assert KV_PRIO > IDLE_PRIO  # under Atlas's turns, after every replica class, idle ones included


def test_a_changing_wan_re_rates_the_kv_class_as_it_was_made():
    rate_bps = 40e6
    for temporal in (True, False):
        cmds = rate_change_commands("west", rate_bps, link_mtu(rate_bps), (0x100,), (KV_MINOR, temporal))
        kv = next(c for c in cmds if f"1:{KV_MINOR:x}" in c)
        assert kv[kv.index("htb") + 1:] == class_args(*kv_class(rate_bps, temporal), link_mtu(rate_bps))


def test_kv_minor_and_port_stay_clear_of_the_link_replica_and_worker_classes():
    assert KV_MINOR not in (1, 0x10) and not 0x100 <= KV_MINOR < 0x100 + 256
    assert DECODE_PORT > BASE_PORT + 64  # classify_kv refuses plans whose worker ports reach it
