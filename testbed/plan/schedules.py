"""Pipeline schedules as plain data: the ordered compute actions of each stage.

Like torch.distributed.pipelining, a schedule is a list of actions per rank, so it can be printed,
tested and executed by the simulator and by emulated workers alike.
"""

from __future__ import annotations

from typing import Literal, NamedTuple


class Action(NamedTuple):
    op: Literal["F", "B"]
    microbatch: int

    def __str__(self) -> str:
        return f"{self.op}{self.microbatch}"


def gpipe(stage: int, pp: int, m: int) -> list[Action]:
    """All forwards, then all backwards, both in microbatch order (as torch's ScheduleGPipe)."""
    return [Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]


def one_f_one_b(stage: int, pp: int, m: int, extra: int = 0) -> list[Action]:
    """PipeDream-Flush 1F1B: warm-up forwards, then alternate one forward and one backward.
    `extra` warm-up forwards let a stage keep more microbatches in flight (to cover WAN round trips);
    extras must not increase along the pipeline or a stage waits for a forward that never comes."""
    warmup = min(pp - stage - 1 + extra, m)
    acts = [Action("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        acts.append(Action("F", f))
        f += 1
        acts.append(Action("B", b))
        b += 1
    acts += [Action("B", i) for i in range(b, m)]
    return acts


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def build_schedule(name: str, pp: int, m: int, extra: list[int] | None = None) -> list[list[Action]]:
    if extra and any(a < b for a, b in zip(extra, extra[1:], strict=False)):
        raise ValueError(f"extra warm-up must not increase along the pipeline: {extra}")
    if name == "1f1b" and extra:
        return [one_f_one_b(s, pp, m, extra[s]) for s in range(pp)]
    return [SCHEDULES[name](s, pp, m) for s in range(pp)]
