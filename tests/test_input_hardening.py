"""Inputs that used to crash, hang or pass silently: each is now one line naming the field, or a row."""

from __future__ import annotations

import pickle
import time

import pytest
import yaml
from typer.testing import CliRunner

from testbed.cli import app
from testbed.errors import SpecError
from testbed.plan.build import divisors_desc, resolve_dp
from testbed.spec.load import load_experiment, load_topology
from tests.conftest import ROOT

TINY = ROOT / "experiments" / "tiny-3dc.yaml"
BUBBLETEA = ROOT / "experiments" / "bubbletea-3dc.yaml"


def error(fn) -> str:
    with pytest.raises(SpecError) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


def test_duplicate_yaml_key_names_key_and_line(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("name: t\ndcs:\n  - {name: a, gpus: 8}\nlinks: []\ndcs:\n  - {name: b, gpus: 8}\n")
    msg = error(lambda: load_topology(p))
    assert msg.startswith(f"{p}:5: duplicate key 'dcs' (first on line 2)"), msg
    p.write_text("dcs:\n  - {name: a, gpus: 8, gpus: 16}\n")  # inside a flow mapping too
    assert "duplicate key 'gpus'" in error(lambda: load_topology(p))


def test_yaml_merge_keys_still_override(tmp_path):
    p = tmp_path / "t.yaml"
    p.write_text("base: &b {name: a, gpus: 8}\ndcs:\n  - {<<: *b, gpus: 16}\n")
    with pytest.raises(SpecError) as e:  # `base` is an unknown field, but the merge itself is accepted
        load_topology(p)
    assert e.value.field == "topology.base"


@pytest.mark.parametrize("value", ["[1,2", "{a:", "*alias", "!!python/object:os.system"])
def test_bad_set_value_names_its_key(value):
    msg = error(lambda: load_experiment(TINY, sets=[f"workload.pp={value}"]))
    assert msg.startswith("workload.pp: value "), msg


def test_bad_sweep_value_names_its_key():
    assert error(lambda: load_experiment(TINY, sweeps=["workload.pp=2,[3"])).startswith("workload.pp: value ")


def test_sweep_size_is_bounded():
    msg = error(lambda: load_experiment(TINY, sweeps=["workload.pp=" + ",".join(["2"] * 101),
                                                      "iterations=" + ",".join(["1"] * 101)]))
    assert msg.startswith("sweep: 10,201 points")


def test_spec_error_survives_pickling_and_is_one_line():
    e = SpecError("a\nb", "bad\x1b[31m", "fix it")
    back = pickle.loads(pickle.dumps(e))
    assert (back.field, back.problem, back.fix) == (e.field, e.problem, e.fix)
    assert str(back) == "a\\nb: bad\\x1b[31m (fix it)"


@pytest.mark.parametrize("n", [1, 2, 12, 36, 97, 1728, 10_000])
def test_divisors_match_brute_force(n):
    assert divisors_desc(n, n) == [d for d in range(n, 0, -1) if n % d == 0]
    assert divisors_desc(n, 10) == [d for d in range(min(n, 10), 0, -1) if n % d == 0]


def test_dp_auto_on_a_huge_batch_is_fast_and_bounded_by_the_gpus():
    # the pipelines only: auto refuses a degree that keeps every dp-wan replica in one DC (test_spec)
    exp, _ = load_experiment(TINY, sets=["workload.global_batch=9999360", "workload.dp=auto", "workload.pp=1",
                                         "schedulers=[pp-wan, atlas]"])[0]
    t0 = time.perf_counter()
    dp = resolve_dp(exp)
    assert time.perf_counter() - t0 < 2.0  # a linear scan of 10 million candidates took minutes
    assert dp <= sum(d.gpus for d in exp.topology.dcs) and 9999360 % dp == 0


def test_sweep_with_infeasible_points_finishes_the_rest_in_a_process_pool(tmp_path):
    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["sim", str(BUBBLETEA), "--out", str(out), "--sweep", "workload.pp=6,8",
                                 "--set", "sweep={}", "--set", "schedulers=[atlas]", "--set", "iterations=1",
                                 "--set", "timeline=none", "--jobs", "2"])
    assert r.exit_code == 0, r.output
    rows = list(__import__("csv").DictReader((out / "summary.csv").open()))
    assert [row["status"] for row in rows][0] == "ok"
    assert rows[1]["status"].startswith("infeasible: workload: 8 stages of tp*dp=64 GPUs need 512 GPUs")
    assert rows[1]["iteration_s"] == "" and rows[1]["sweep"] == "workload.pp=8"
    assert "infeasible: p01-atlas (workload.pp=8)" in r.stdout
    from testbed.figures.draw import read_summary

    assert list(read_summary(out / "summary.csv").status) == ["ok"]


def test_sweep_where_nothing_runs_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["sim", str(TINY), "--out", str(out), "--sweep", "workload.pp=8,16", "--jobs", "2"])
    assert r.exit_code == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == ["error: workload.pp: 8 stages for a 4-layer model (use pp <= 4)"]
    assert not out.exists()


def test_scale_outside_what_the_emulator_carries_is_a_field_error():
    from testbed.emu.scale import check_scale, check_transfer_bytes

    topo = load_topology(ROOT / "topologies" / "3dc.yaml")  # 400 Gbit/s links
    msg = error(lambda: check_scale(topo, 1e9))
    assert msg.startswith("emulation.scale: k=1e+09 brings link useast-uscentral to 400 bit/s")
    assert "k <= 500,000" in msg
    assert "k >= 4" in error(lambda: check_scale(topo, 0.001))
    assert "not a positive finite" in error(lambda: check_scale(topo, float("nan")))
    check_scale(topo, 2000)  # the default for 3dc passes
    assert "below one byte" in error(lambda: check_transfer_bytes([16384.0, 0.0], [1e6, 1e6], 2, 20000))
    check_transfer_bytes([16384.0, 0.0], [1e6, 1e6], 2, 2000)


def test_experiment_run_rejects_a_bad_scale_before_anything_is_built(tmp_path):
    r = CliRunner().invoke(app, ["experiment", "run", str(ROOT / "experiments" / "emu-3dc.yaml"), "--out",
                                 str(tmp_path / "x"), "--set", "emulation.scale=1e9"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: emulation.scale: k=1e+09")
    assert not (tmp_path / "x").exists()


def test_trace_that_is_a_folder_is_a_field_error(tmp_path):
    from testbed.bubbletea.trace import load_trace

    assert error(lambda: load_trace(tmp_path)).startswith("bubbletea.trace:")
    bad = tmp_path / "t.csv"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    assert error(lambda: load_trace(bad)).startswith("bubbletea.trace:")


def test_names_with_markup_are_printed_verbatim(tmp_path):
    data = yaml.safe_load(TINY.read_text())
    data["name"] = "[bold]x[/] [/red]"
    data["topology"] = str(ROOT / "topologies" / "3dc.yaml")
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["sim", str(p), "--out", str(tmp_path / "o"), "--jobs", "1"])
    assert r.exit_code == 0, r.output
    assert "[bold]x[/] [/red]: simulated" in r.stdout
