"""Pure parts of `testbed launch --cluster`: which files travel with the command and where a machine runs them,
each rank's environment from its own machine's cores and GPUs, and the options refused before anything is built.
(tests/integration/test_cluster_launch.py runs a torch job across three local machines.)"""

from __future__ import annotations

import pytest

from testbed.cluster.launch import MAX_CARRY_BYTES, carried_files, forwarded_env, rank_envs
from testbed.cluster.placement import plan_cluster
from testbed.cluster.ranks import place, rank_environ
from testbed.emu.names import address_plan
from testbed.errors import NotYetError, SpecError
from testbed.launch.ranks import layout
from testbed.launch.wan import refuse_on_cluster
from testbed.spec.cluster import Cluster
from tests.test_launch_pure import TOPO


@pytest.fixture
def script(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    (d / "train.py").write_text("import helper\n")
    (d / "helper.py").write_text("X = 1\n")
    (d / "notes.txt").write_text("not code")
    (d / "cfg.yaml").write_text("lr: 1\n")
    return d


def test_a_script_travels_with_the_python_files_beside_it_and_a_config_alone(script):
    carried = carried_files(["python", "job/train.py", "--config", str(script / "cfg.yaml"), "--steps", "3"],
                            str(script.parent))
    assert [(c.index, c.path) for c in carried] == [(1, str(script / "train.py")), (3, str(script / "cfg.yaml"))]
    assert carried[0].files == {"train.py": b"import helper\n", "helper.py": b"X = 1\n"}
    assert carried[1].files == {"cfg.yaml": b"lr: 1\n"}


def test_the_interpreter_and_words_that_name_no_file_stay_as_they_are(script):
    (script / "python").write_text("a file named like the interpreter")
    assert carried_files(["python", "-c", "print(1)", "3"], str(script)) == []


def test_too_much_to_carry_is_refused_naming_the_argument(script):
    (script / "data.bin").write_bytes(b"0" * (MAX_CARRY_BYTES + 1))
    with pytest.raises(SpecError, match="command argument data.bin"):
        carried_files(["python", "data.bin"], str(script))


def test_a_machine_with_the_same_file_runs_it_in_place_another_gets_a_copy(script, tmp_path):
    carried = carried_files(["python", "train.py", "--lr", "1"], str(script))
    argv = ["/venv/bin/python", "train.py", "--lr", "1"]
    same, notes = place(carried, argv, tmp_path / "launch")
    assert same == argv and notes == [] and not (tmp_path / "launch").exists()
    (script / "train.py").write_text("import helper  # this machine's older copy\n")
    moved, notes = place(carried, argv, tmp_path / "launch")
    copy = tmp_path / "launch" / "arg1" / "train.py"
    assert moved == ["/venv/bin/python", str(copy), "--lr", "1"] and len(notes) == 1
    assert copy.read_text() == "import helper\n" and (copy.parent / "helper.py").read_text() == "X = 1\n"


def test_each_rank_gets_torchruns_environment_with_its_own_machines_cores_and_gpus():
    plan = plan_cluster(TOPO, Cluster.model_validate({"machines": [{"name": "a", "address": "10.0.0.1"},
                                                                   {"name": "b", "address": "10.0.0.2"}],
                                                      "placement": {"east": "a", "west": "b", "mid": "b"}}))
    slots = layout(address_plan(TOPO, "gdtbl1"), 2)
    where = {s.rank: plan.dc_machine[s.dc] for s in slots}
    envs = rank_envs(slots, where, {"a": {"cpus": 8, "gpus": ["0", "1", "2", "3"]}, "b": {"cpus": 12, "gpus": []}},
                     master_port=29500, connections=1, dcs=["east", "west", "mid"], out_dir="/o", scale=50,
                     links_file="/o/links.json",
                     forwarded=forwarded_env({"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "PATH": "/x"}))
    assert sorted(envs) == list(range(10))
    assert {e["MASTER_ADDR"] for e in envs.values()} == {slots[0].ip} and slots[0].dc == "east"
    assert [envs[r]["RANK"] for r in range(10)] == [str(r) for r in range(10)]
    on_a = [s.rank for s in slots if where[s.rank] == "a"]
    assert [envs[r]["CUDA_VISIBLE_DEVICES"] for r in on_a] == ["0", "1", "2", "3"]  # east's 4 ranks on a's 4 GPUs
    assert {envs[r]["OMP_NUM_THREADS"] for r in on_a} == {"2"}  # 8 cores over 4 ranks
    on_b = [r for r in range(10) if r not in on_a]
    assert all(envs[r]["TESTBED_DEVICE"] == "cpu" and "CUDA_VISIBLE_DEVICES" not in envs[r] for r in on_b)
    assert {envs[r]["OMP_NUM_THREADS"] for r in on_b} == {"2"}  # 12 cores over 6 ranks
    assert {envs[r]["TESTBED_LINKS"] for r in range(10)} == {"/o/links.json"}
    # the driver's NCCL_DEBUG reaches every rank; what the launch sets wins; the driver's PATH is its own
    assert all(envs[r]["NCCL_DEBUG"] == "INFO" and envs[r]["NCCL_SOCKET_IFNAME"] == "eth0" and "PATH" not in envs[r]
               for r in range(10))


def test_options_a_cluster_cannot_run_yet_are_refused_naming_them():
    refuse_on_cluster("netns", False, False, "fair")
    for args, flag in ((("docker", False, False, "fair"), "--backend docker"), (("netns", True, False, "fair"),
                       "--capture"), (("netns", False, True, "fair"), "--check"),
                       (("netns", False, False, "temporal"), "--sharing temporal")):
        with pytest.raises(NotYetError, match=f"launch --cluster with {flag}: not yet"):
            refuse_on_cluster(*args)


def test_a_rank_does_not_inherit_rays_settings(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("HOME", "/root")
    env = rank_environ()
    assert "RAY_ADDRESS" not in env and "CUDA_VISIBLE_DEVICES" not in env and env["HOME"] == "/root"


def test_launch_cluster_refuses_a_capture_before_joining_any_cluster(tmp_path):
    from typer.testing import CliRunner

    from testbed.cli import app
    from tests.conftest import ROOT

    (tmp_path / "cluster.yaml").write_text("ray_address: 10.255.255.1:6379\n")  # nothing there: never reached
    r = CliRunner().invoke(app, ["launch", str(ROOT / "experiments" / "emu-3dc-topology.yaml"), "--cluster",
                                 str(tmp_path / "cluster.yaml"), "--capture", "--out", str(tmp_path / "o"), "--",
                                 "python", "x.py"])
    assert r.exit_code == 3 and "launch --cluster with --capture: not yet" in r.output, r.output
    assert not (tmp_path / "o").exists()
