"""Time to a target loss: the comparison of training methods on the same WAN (examples/diloco.py
writes one CSV per method: method, step, wall_s, loss, eval_loss). Pure: unit-tested."""

from __future__ import annotations

import math
from collections.abc import Iterable

CONVERGENCE_HEADER = ("method", "target_loss", "time_to_target_s", "steps_to_target", "final_eval_loss", "steps",
                      "wall_s", "s_per_step")


def evaluated(rows: Iterable[dict]) -> list[tuple[int, float, float]]:
    """(step, wall_s, eval_loss) of the rows that carry a held-out evaluation."""
    out = []
    for r in rows:
        ev = r.get("eval_loss")
        if ev not in (None, "") and not (isinstance(ev, float) and math.isnan(ev)):
            out.append((int(r["step"]), float(r["wall_s"]), float(ev)))
    return out


def time_to_target(rows: list[dict], target: float) -> tuple[float, int] | None:
    """(wall_s, step) of the first evaluation at or below `target`; None if never reached."""
    for step, wall, ev in evaluated(rows):
        if ev <= target:
            return wall, step
    return None


def convergence_row(method: str, rows: list[dict], target: float) -> tuple:
    hit = time_to_target(rows, target)
    ev = evaluated(rows)
    last = rows[-1]
    steps, wall = int(last["step"]), float(last["wall_s"])
    return (method, target, round(hit[0], 3) if hit else "", hit[1] if hit else "", ev[-1][2] if ev else "", steps,
            round(wall, 3), round(wall / steps, 4) if steps else "")
