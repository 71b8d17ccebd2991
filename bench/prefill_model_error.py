"""Error of the prefill cost models against measured prompt times (Splitwise perf_model.csv), held out.

Over the deduplicated configurations (one row per model, GPU, TP, prompt and batch: the median of its
repeats), for the default model first (`bubbletea.prefill_model: ops`, testbed/costs/prefill_ops.py: the
training's operators) and then the fitted curve (`curve`, testbed/costs/prefill.py):
- 5-fold cross-validation grouped by configuration (each configuration's repeats stay in one fold);
- 5-fold grouped by prompt shape ((prompt, batch) held out on every GPU, TP and model at once);
- leave-one-model-out (fit on llama2-70b, predict bloom-176b and back);
the curve also in-sample, leave-one-configuration-out and extrapolating from passes of <= 1,024 tokens;
then, for every BubbleTea model the shipped experiments use, whether a measurement backs it.
--fit refits both models on all rows and prints them in the form their modules hold.
Run: .venv/bin/python bench/prefill_model_error.py [PATH_TO_perf_model.csv] [--fit]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testbed.costs import prefill_model  # noqa: E402
from testbed.costs.prefill import (  # noqa: E402
    HARDWARE,
    consistent_rows,
    dedupe,
    fit,
    held_out_errors,
    load_perf_rows,
    measured,
    relative_errors,
    spread,
)

DEFAULT = ROOT.parent / "shared" / "data" / "splitwise-perf-model" / "perf_model.csv"


def line(name: str, errs: list[dict]) -> None:
    med, p90 = spread([e["rel_err"] for e in errs])
    print(f"  {name:<58}{len(errs):>6}{med:>10.1%}{p90:>9.1%}")


def describe(r: dict) -> str:
    return f"{r['model']} {r['hardware']} TP {r['tp']} {r['prompt']}x{r['batch']}"


def shipped_models() -> list[tuple[str, str, str, int]]:
    """(experiment, inference model, GPU, TP) for every experiment with a +bubbletea scheduler."""
    from testbed.sim.choose import build_plan
    from testbed.spec.load import load_experiment

    out = []
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        if "bubbletea" not in path.read_text():
            continue  # topologies and experiments without BubbleTea
        (exp, _), *_ = load_experiment(path, sets=["bubbletea.trace=synthetic"])
        scheds = [s for s in exp.schedulers if s.endswith("+bubbletea")]
        if not scheds:
            continue
        plan = build_plan(exp, scheds[0])
        for gpu in sorted({plan.gpu_types[dc] for dc in plan.dcs_used()}):
            out.append((path.name, exp.bubbletea.model, "cpu" if exp.emulation.compute == "torch" else gpu, plan.tp))
    return out


def ops_section(rows: list[dict]) -> None:
    """The held-out schemes for the default model, prefill from the training's operators."""
    from testbed.costs import prefill_ops

    def ops_line(name: str, errs: list[float]) -> None:
        med, p90 = spread(errs)
        print(f"  {name:<58}{len(errs):>6}{med:>10.1%}{p90:>9.1%}")

    print("\n  prefill_model: ops (the default; testbed/costs/prefill_ops.py, the training's operators):")
    ops_line("leave-one-model-out", prefill_ops.held_out(rows, lambda r: r["model"]))
    for m in sorted({r["model"] for r in rows}):
        others = [r for r in rows if r["model"] != m]
        cal = prefill_ops.fit_rows(others)
        errs = [abs(prefill_ops.ops_time_s(prefill_ops.row_work(r), cal[HARDWARE[r["hardware"]]]) / r["time_s"] - 1)
                for r in rows if r["model"] == m]
        ops_line(f"  {m} predicted from the others", errs)
    cfg = (lambda r: (r["model"], r["hardware"], r["tp"], r["prompt"], r["batch"]))  # noqa: E731
    ops_line("5-fold grouped by configuration", prefill_ops.held_out(rows, cfg, 5))
    ops_line("5-fold grouped by prompt shape (prompt, batch)",
             prefill_ops.held_out(rows, lambda r: (r["prompt"], r["batch"]), 5))
    ops_line("in-sample (shipped OPS_CALIBRATION; not a held-out number)", [
        abs(prefill_ops.ops_time_s(prefill_ops.row_work(r), prefill_ops.OPS_CALIBRATION[HARDWARE[r["hardware"]]])
            / r["time_s"] - 1) for r in rows])


def curve_section(rows: list[dict]) -> None:
    """The same for the fitted curve (bubbletea.prefill_model: curve), and its in-sample error."""
    print("\n  prefill_model: curve (testbed/costs/prefill.py, a roofline fitted per GPU):")
    lomo = held_out_errors(rows, lambda r: r["model"])
    line("leave-one-model-out", lomo)
    for m in sorted({e["model"] for e in lomo}):
        line(f"  {m} predicted from the others", [e for e in lomo if e["model"] == m])
    line("5-fold grouped by configuration", held_out_errors(
        rows, lambda r: (r["model"], r["hardware"], r["tp"], r["prompt"], r["batch"]), folds=5))
    line("5-fold grouped by prompt shape (prompt, batch)",
         held_out_errors(rows, lambda r: (r["prompt"], r["batch"]), 5))
    line("leave-one-configuration-out", held_out_errors(
        rows, lambda r: (r["model"], r["hardware"], r["tp"], r["prompt"], r["batch"])))
    short = [r for r in rows if r["prompt"] * r["batch"] <= 1024]
    line("fitted on <= 1,024 tokens per pass, scored on longer", relative_errors(
        [r for r in rows if r["prompt"] * r["batch"] > 1024], fit(short)))
    line("in-sample (shipped calibration; not a held-out number)", relative_errors(rows))


def print_fits(rows: list[dict]) -> None:
    from testbed.costs import prefill_ops

    print("  testbed/costs/prefill_ops.py OPS_CALIBRATION:")
    for g, o in prefill_ops.fit_rows(rows).items():
        print(f"    {g!r}: OpsCalibration({o.overhead_per_layer_s:.6g}, {o.scale:.4g}, {o.comm_factor:.4g}, "
              f"{o.large_pass_factor:.4g}),")
    print("  testbed/costs/prefill.py CALIBRATION:")
    for g, c in fit(rows).items():
        print(f"    {g!r}: Calibration({c.overhead_per_layer_s:.6g}, {c.flop_rate:.4g}, {c.allreduce_rate:.4g}, "
              f"{c.large_pass_factor:.4g}),")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    path = Path(args[0]) if args else DEFAULT
    if not path.exists():
        raise SystemExit(f"{path} not found: download perf_model.csv from the splitwise-sim repository (data/)")
    raw = load_perf_rows(path)
    ours = [r for r in raw if r["hardware"] in HARDWARE]
    rows, dropped = consistent_rows(dedupe(ours))
    print(f"{path.name}: {len(raw)} rows; {len(ours)} on GPUs of the zoo (power-capped H100 rows left out); "
          f"{len(dedupe(ours))} distinct configurations; {len(dropped)} dropped as inconsistent "
          f"({', '.join(describe(r) for r in dropped)}); "
          f"{len(rows)} scored")
    if "--fit" in sys.argv:
        print_fits(rows)
    print(f"\n  {'held-out scheme':<58}{'rows':>6}{'median':>10}{'p90':>9}")
    ops_section(rows)
    curve_section(rows)

    print("\n  curve, per (model, GPU, TP), 5-fold grouped by configuration:")
    by = defaultdict(list)
    for e in held_out_errors(rows, lambda r: (r["model"], r["hardware"], r["tp"], r["prompt"], r["batch"]), 5):
        by[(e["model"], e["gpu"], e["tp"])].append(e)
    for (m, g, tp), errs in sorted(by.items()):
        line(f"{m} {g} TP {tp}", errs)

    print("\n  BubbleTea inference models in the shipped experiments (default prefill model, ops):")
    for name, model, gpu, tp in shipped_models():
        if gpu == "cpu":  # real compute: the emulated run times this model on this CPU and fits the roofline to it
            print(f"  {name:<28}{model:<12}this CPU: measured at run time (cpu_prefill.csv, held-out errors there)")
            continue
        cal, own = prefill_model.coverage(gpu)
        backed = "measured" if measured(model, gpu, tp) else "NOT measured: predicted from its shape"
        borrowed = "" if own else f" (the {gpu}'s operators with the {cal}'s serving constants)"
        print(f"  {name:<28}{model:<12}{gpu} TP {tp}: {backed}{borrowed}")

if __name__ == "__main__":
    main()
