"""Which prefill model times BubbleTea's prefill (testbed/costs/prefill_model.py): the training's operators by
default, the fitted curve as an option. Mechanisms only: more work never takes less time, a cached prefix is
not recomputed, the option reaches every place prefill is timed, and GPUs without measurements are covered."""

from __future__ import annotations

import pytest

from testbed.bubbletea.run import fallback_pool, group_costs
from testbed.costs import gpu_specs, prefill, prefill_model, prefill_ops
from testbed.costs.gpus import GPUS
from testbed.costs.models import MODELS
from testbed.errors import SpecError
from testbed.sim.choose import build_plan
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

ZOO = ["A100", "A100-40", "H100", "H100-PCIE", "H200", "B200", "MI300X"]
BT = ROOT / "experiments" / "bubbletea-3dc.yaml"


def _bt(sets: list[str] = (), path=BT):
    (exp, _), *_ = load_experiment(path, sets=["bubbletea.trace=synthetic", "sweep={}", *sets])
    return exp, build_plan(exp, "atlas+bubbletea")


@pytest.mark.parametrize("gpu", ZOO)
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_a_larger_pass_never_takes_less_time(gpu, tp):
    m = MODELS["llama2-7b"]
    for tokens in (1, 64, 512, 2048, 2049, 8192):
        ts = [prefill_model.prefill_time_s(m, gpu, tp, tokens, b) for b in (1, 2, 4, 16, 64)]
        assert ts == sorted(ts), (tokens, ts)
    for b in (1, 8):
        ts = [prefill_model.prefill_time_s(m, gpu, tp, n, b) for n in (1, 16, 256, 1024, 2048, 2049, 4096, 16384)]
        assert ts == sorted(ts), (b, ts)


@pytest.mark.parametrize("kind", prefill_model.PREFILL_MODELS)
def test_a_cached_prefix_costs_less_than_prefilling_it_again(kind):
    m = MODELS["llama2-70b"]
    for done, chunk in ((512, 512), (2048, 1024), (6144, 2048)):
        whole = prefill_model.prefill_time_s(m, "H100", 8, done + chunk, kind=kind)
        rest = prefill_model.chunk_time_s(m, "H100", 8, done, chunk, kind=kind)
        fresh = prefill_model.chunk_time_s(m, "H100", 8, 0, chunk, kind=kind)
        assert fresh <= rest < whole  # attends to the cache, never recomputes it
    cached = prefill_ops.pass_ops(m, "H100", 8, 1024, cached=4096)
    assert cached.ops_s > prefill_ops.pass_ops(m, "H100", 8, 1024).ops_s  # the attention over the cache is work


def test_the_option_switches_the_model_everywhere_prefill_is_timed():
    m = MODELS["llama2-7b"]
    for kind, mod in (("ops", prefill_ops), ("curve", prefill)):
        exp, plan = _bt([f"bubbletea.prefill_model={kind}"])
        (dc, cost), *_ = group_costs(plan, exp.bubbletea)[0].items()
        gpu = plan.gpu_types[dc]
        assert cost.full(3000) == mod.prefill_time_s(m, gpu, plan.tp, 3000)
        assert cost.chunk(1024, 512) == mod.chunk_time_s(m, gpu, plan.tp, 1024, 512)
        pool = fallback_pool(plan, exp.bubbletea, exp.seed)
        server = pool.servers[0]
        assert server.prefill_s(3000) == mod.prefill_time_s(m, plan.gpu_types[server.dc], pool.gpus_per_server, 3000)
    assert prefill_ops.prefill_time_s(m, "H100", 4, 3000) != prefill.prefill_time_s(m, "H100", 4, 3000)
    exp, _ = _bt()
    assert exp.bubbletea.prefill_model == prefill_model.DEFAULT_PREFILL_MODEL == "ops"


def test_a_bad_prefill_model_names_the_field():
    with pytest.raises(SpecError, match=r"^bubbletea\.prefill_model: .*'ops' or 'curve'") as e:
        _bt(["bubbletea.prefill_model=roofline"])
    assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match="bubbletea.prefill_model: unknown prefill model 'x' .use ops or curve."):
        prefill_model.prefill_time_s(MODELS["llama2-7b"], "H100", 1, 10, kind="x")


def test_gpus_without_measurements_borrow_a_measured_stack_and_keep_their_own_operators(zoo):
    assert prefill_model.coverage("A100") == ("A100", True) and prefill_model.coverage("A100-40") == ("A100", False)
    for gpu in ("H200", "B200", "MI300X", "H100-PCIE"):
        assert prefill_model.coverage(gpu) == ("H100", False)
    m = MODELS["llama2-7b"]
    # same serving constants, own operators: the B200's datasheet makes a long pass faster than on the H100
    assert prefill_model.prefill_time_s(m, "B200", 1, 8192) < prefill_model.prefill_time_s(m, "H100", 1, 8192)
    gpu_specs.register_gpu("L40S", {"peak_tflops": 362, "memory_gb": 48, "hbm_gbps": 864, "nvlink_gbps": 64,
                                    "like": "A100"})
    assert prefill_model.coverage("L40S") == ("A100", False)
    own = prefill_ops.ops_time_s(prefill_ops.pass_ops(m, "L40S", 1, 8192), prefill_ops.OPS_CALIBRATION["A100"])
    assert prefill_model.prefill_time_s(m, "L40S", 1, 8192) == own != prefill_model.prefill_time_s(m, "A100", 1, 8192)
    with pytest.raises(SpecError, match="no prefill calibration for 'B200'"):
        prefill_model.prefill_time_s(m, "B200", 1, 100, kind="curve")


def test_the_emulated_service_times_jobs_as_the_simulator_does(zoo):
    """The service (its own process) rebuilds the orchestrator's GPUs from its configuration, a user's included."""
    from testbed.bubbletea.emulated import service_config
    from testbed.bubbletea.service import planner_from

    gpu_specs.register_gpu("L40S", {"peak_tflops": 362, "memory_gb": 48, "hbm_gbps": 864, "nvlink_gbps": 64,
                                    "like": "A100"})
    for kind in prefill_model.PREFILL_MODELS:
        gpu = "L40S" if kind == "ops" else "H100"
        exp, plan = _bt([f"bubbletea.prefill_model={kind}", f"topology.dcs.*.gpu={gpu}"],
                        ROOT / "experiments" / "emu-bubbletea.yaml")
        cfg, _ = service_config(plan, exp, 10.0, None)
        m = MODELS[exp.bubbletea.model]
        expected = {name: (w["gpu"], prefill_model.prefill_time_s(m, w["gpu"], w["tp"], 1500, kind=kind),
                           prefill_model.chunk_time_s(m, w["gpu"], w["tp"], 500, 700, kind=kind))
                    for name, w in cfg["workers"].items()}
        if gpu == "L40S":  # as in the service's process: only what the configuration carries
            GPUS.pop(gpu)
            gpu_specs.COMPUTE_SPECS.pop(gpu)
        planner = planner_from(cfg)
        for name, (g, full_s, chunk_s) in expected.items():
            cost = planner.workers[name][1]
            assert g == gpu and (cost.full(1500), cost.chunk(500, 700)) == (full_s, chunk_s)
