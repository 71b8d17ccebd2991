"""The published Llama-3 405B layout (experiments/llama3-405b-1dc.yaml) simulated with plain 1F1B, interleaved
1F1B and the zero-bubble schedule: iteration time, bubble, peak memory per GPU and model TFLOP/s per GPU at the
workload's mfu.

Model FLOPs count the work of the model, not of the recomputation: 3 x the forward FLOPs of every layer and the
output head per sequence (ModelConfig's formulas, the ones the cost model uses). A layout the memory model refuses
is also simulated with the GPU's memory check lifted (`--what-if-memory`), so that its time can be compared.

    .venv/bin/python bench/interleaved_llama3.py [--what-if-memory]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from testbed.costs import gpus
from testbed.costs.models import resolve_model
from testbed.errors import SpecError
from testbed.sim.choose import build_plan
from testbed.sim.executor import simulate
from testbed.spec.load import load_experiment
from testbed.timeline import COMPUTE

SPEC = Path(__file__).resolve().parent.parent / "experiments" / "llama3-405b-1dc.yaml"
CASES = [(1, "selective", "1f1b"), (8, "selective", "1f1b"), (1, "selective", "zb"), (1, "full", "1f1b"),
         (8, "full", "1f1b"), (1, "full", "zb")]


def model_tflops_per_gpu(exp, iteration_s: float, gpus_used: int) -> float:
    w = exp.workload
    m = resolve_model(w.model, w.seq_len)
    s = m.seq_len
    per_seq = 3 * (m.layers * m.layer_fwd_flops(s, s) + m.logits_fwd_flops(s))
    return per_seq * w.global_batch / iteration_s / gpus_used / 1e12


def run(v: int, recompute: str, schedule: str, lift_memory: bool) -> str:
    (exp, _), = load_experiment(SPEC, sets=[f"workload.virtual_stages={v}", f"workload.recompute={recompute}",
                                            f"workload.schedule={schedule}"])
    note = ""
    try:
        plan = build_plan(exp, "pp-wan")
    except SpecError as e:
        if not lift_memory:
            return f"{schedule:4s} V={v} {recompute:9s} refused: {e}"
        h100 = gpus.GPUS["H100"]
        gpus.GPUS["H100"] = dataclasses.replace(h100, memory_gb=1e6)
        try:
            plan = build_plan(exp, "pp-wan")
        finally:
            gpus.GPUS["H100"] = h100
        note = f"  (memory check lifted; refused: {e.problem})"
    tl, _ = simulate(plan)
    it = tl.iteration_s[0]
    busy = max(sum(iv.dur for iv in tl.intervals if iv.kind in COMPUTE and iv.stage == s and iv.replica == 0)
               for s in range(plan.pp))
    tf = model_tflops_per_gpu(exp, it, plan.gpus)
    return (f"{schedule:4s} V={v} {recompute:9s} iteration {it:7.3f} s  bubble {1 - busy / it:6.1%}  "
            f"peak {max(plan.mem_gb):5.1f} GB  model {tf:6.1f} TFLOP/s per GPU (mfu {exp.workload.mfu}){note}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--what-if-memory", action="store_true", help="simulate refused layouts with memory unchecked")
    args = ap.parse_args()
    for v, rc, sched in CASES:
        print(run(v, rc, sched, args.what_if_memory), flush=True)


if __name__ == "__main__":
    main()
