"""Atlas's choice, run: every candidate plan (testbed/plan/choose.py) simulated once and the fastest kept, and
build_plan, any scheduler's plan with the mechanisms it leaves to the plan chosen so. It sits above the simulator
it runs, so plan/ never imports an engine."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from testbed.errors import SpecError
from testbed.net.links import NetPlan
from testbed.plan.build import build_fixed, builder, resolve_dp, searched
from testbed.plan.choose import Pick, candidates, fingerprint, label, resolved
from testbed.plan.network import boundary_connections
from testbed.plan.plan import Plan
from testbed.sim.executor import simulate
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import Mechanisms, parse_scheduler

# simulated iteration times kept per process, by plan content: a bench's ablations share Atlas's candidates
_CACHE_SIZE = 512
_simulated: OrderedDict[str, float] = OrderedDict()


def simulated_s(plan: Plan, key: str) -> float:
    """The plan's simulated iteration time, once per process per plan content."""
    if key in _simulated:
        _simulated.move_to_end(key)
        return _simulated[key]
    t = simulate(plan)[0].iteration_s[0]
    _simulated[key] = t
    if len(_simulated) > _CACHE_SIZE:
        _simulated.popitem(last=False)
    return t


def choose(mech: Mechanisms, dp: int, orders: tuple[str, ...], build: Callable[[Mechanisms, Pick], Plan],
           sidecars: tuple[str, ...] = ("",)) -> tuple[Plan, Pick, int]:
    """The fastest candidate's plan (built by `build` from a resolved Mechanisms and the pick, for its turn
    order and sidecar), its pick, and how many
    distinct plans were simulated (candidates whose plans coincide, e.g. the warm-up where it asks for no
    extra microbatch or greedy placement on equal DCs, are simulated once and the simpler one kept)."""
    best: tuple[float, Plan, Pick] | None = None
    seen: set[str] = set()
    failed: SpecError | None = None
    for pick in candidates(mech, dp, orders, sidecars):
        try:
            plan = build(resolved(mech, pick), pick)
        except SpecError as e:  # e.g. a placement that does not fit: the other candidates may
            failed = e  # the last: the candidate with most mechanisms (greedy placement's message for atlas)
            continue
        key = fingerprint(plan)
        if key in seen:
            continue
        seen.add(key)
        t = simulated_s(plan, key)
        if best is None or t < best[0]:
            best = (t, plan, pick)
    if best is None:
        assert failed is not None  # every mechanism has at least one option
        raise failed
    return best[1], best[2], len(seen)


def build_plan(
    exp: Experiment, scheduler: str, run_id: str = "run", dp: int | None = None, order: list[str] | None = None,
    counts: list[int] | None = None, built: NetPlan | None = None,
) -> Plan:
    """`order` pins the pipeline's DC chain and `counts` its stages per DC (DC selection); by default the
    scheduler's placement decides. Mechanisms the scheduler leaves to the plan (atlas) are chosen by
    simulating each candidate set (testbed/plan/choose.py). `built`: the network as the emulator builds it
    (testbed/plan/network.py lower_network with its k), whose windows and turns the plan models; None for a
    simulation."""
    mech = parse_scheduler(scheduler)
    if not mech.auto:
        return build_fixed(exp, scheduler, mech, run_id, dp, order, counts, built)
    dp = dp or resolve_dp(exp)
    orders, sidecars = searched(exp, mech, dp)
    plan, pick, _ = choose(mech, dp, orders, builder(exp, scheduler, run_id, dp, order, counts, built), sidecars)
    plan.meta["mechanisms"] = label(plan, pick, boundary_connections(mech, exp.workload.tp, exp.network))
    return plan
