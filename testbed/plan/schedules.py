"""Pipeline schedules as plain data: the ordered compute actions of each stage.

Like torch.distributed.pipelining, a schedule is a list of actions per rank, so it can be printed,
tested and executed by the simulator and by emulated workers alike. With virtual stages (Megatron's
interleaved 1F1B) each stage holds V model chunks and an action names the chunk it runs.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from testbed.costs.stage import interleaved_warmup


class Action(NamedTuple):
    # F forward; B backward (under "zb" its input gradient only); W the weight gradient ("zb")
    op: Literal["F", "B", "W"]
    microbatch: int
    chunk: int = 0  # which of the stage's model chunks (virtual stages); 0 without interleaving

    def __str__(self) -> str:
        return f"{self.op}{self.microbatch}" + (f"c{self.chunk}" if self.chunk else "")


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


def virtual_step(k: int, pp: int, v: int, forward: bool) -> tuple[int, int]:
    """The k-th forward (or backward) of a stage as (microbatch, chunk), as Megatron orders them: groups of pp
    microbatches go through chunk 0, then chunk 1, ... (backwards through the chunks in reverse)."""
    group, within = divmod(k, pp * v)
    chunk = within // pp
    return group * pp + within % pp, chunk if forward else v - 1 - chunk


def interleaved(stage: int, pp: int, m: int, v: int) -> list[Action]:
    """Megatron's interleaved 1F1B on one stage holding v model chunks (chunk c of stage s is model piece
    c pp + s): warm-up forwards, then one forward and one backward in turn, then the remaining backwards."""
    total = m * v
    warmup = interleaved_warmup(stage, pp, m, v)
    acts = [Action("F", *virtual_step(k, pp, v, True)) for k in range(warmup)]
    for k in range(total - warmup):
        acts.append(Action("F", *virtual_step(warmup + k, pp, v, True)))
        acts.append(Action("B", *virtual_step(k, pp, v, False)))
    acts += [Action("B", *virtual_step(k, pp, v, False)) for k in range(total - warmup, total)]
    return acts


def _zb_next(s: int, st: dict, pp: int, m: int, f_end: list, b_end: list) -> tuple[float, int, str, int] | None:
    """Stage s's next action under the zero-bubble rule as (earliest start, priority, op, microbatch): a backward
    when its gradient is in, else a forward while fewer than pp microbatches hold activations, else a W."""
    cands = []
    k = st["b"]
    if k < m and f_end[s][k] is not None:
        dep = f_end[s][k] if s == pp - 1 else b_end[s + 1][k]
        if dep is not None:
            cands.append((max(st["free"], dep), 0, "B", k))
    k = st["f"]
    if k < m and st["f"] - st["w"] < pp:
        dep = 0.0 if s == 0 else f_end[s - 1][k]
        if dep is not None:
            cands.append((max(st["free"], dep), 1, "F", k))
    if st["w"] < st["b"]:
        cands.append((st["free"], 2, "W", st["w"]))
    if not cands:
        return None
    t = min(c[0] for c in cands)
    return min((c for c in cands if c[0] <= t), key=lambda c: c[1])


def zero_bubble(pp: int, m: int) -> list[list[Action]]:
    """A zero-bubble schedule in the manner of ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
    the backward is split into B (the input gradient, which the stage before waits for) and W (the weight
    gradient, which nobody waits for). Each stage runs, whenever it is free, a B whose gradient has arrived, else
    a forward while fewer than pp microbatches hold activations (1F1B's peak, on its first stage), else its
    oldest pending W. The orders come from playing that rule with F = B = W = 1 and free messages (so they can
    run, whatever the real times: the dry run checks it); the bubble is then pp - 1 to 2 (pp - 1) slots of one
    pass (pp - 1 when m = pp), against 1F1B's 3 (pp - 1)."""
    f_end = [[None] * m for _ in range(pp)]
    b_end = [[None] * m for _ in range(pp)]
    state = [{"f": 0, "b": 0, "w": 0, "free": 0.0} for _ in range(pp)]
    out: list[list[Action]] = [[] for _ in range(pp)]
    for _ in range(3 * m * pp):
        best = min((nxt + (s,) for s in range(pp) if (nxt := _zb_next(s, state[s], pp, m, f_end, b_end))),
                   key=lambda c: (c[0], c[4]))
        t, _, op, k, s = best
        st = state[s]
        st["free"] = t + 1.0
        out[s].append(Action(op, k))
        if op == "F":
            f_end[s][k], st["f"] = t + 1.0, st["f"] + 1
        elif op == "B":
            b_end[s][k], st["b"] = t + 1.0, st["b"] + 1
        else:
            st["w"] += 1
    return out


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def check_interleaving(pp: int, m: int, v: int) -> str:
    """Why Megatron's interleaved schedule cannot run this job ('' if it can): it needs more than one stage
    and a number of microbatches per replica that is a multiple of pp."""
    if v > 1 and pp < 2:
        return f"virtual_stages={v} needs pp >= 2 (the chunks interleave across stages)"
    if v > 1 and m % pp:
        return f"{m} microbatches per replica is not a multiple of pp={pp} (Megatron's interleaved schedule)"
    return ""


def build_schedule(name: str, pp: int, m: int, extra: list[int] | None = None, v: int = 1) -> list[list[Action]]:
    if extra and any(a < b for a, b in zip(extra, extra[1:], strict=False)):
        raise ValueError(f"extra warm-up must not increase along the pipeline: {extra}")
    if name == "zb":
        if v > 1:
            raise ValueError("the zero-bubble schedule runs one model chunk per stage: virtual_stages 1")
        return zero_bubble(pp, m)
    if v > 1:
        why = check_interleaving(pp, m, v)
        if name != "1f1b" or why:
            raise ValueError(why or f"virtual stages need the 1f1b schedule, not {name}")
        return [interleaved(s, pp, m, v) for s in range(pp)]
    if name == "1f1b" and extra:
        return [one_f_one_b(s, pp, m, extra[s]) for s in range(pp)]
    return [SCHEDULES[name](s, pp, m) for s in range(pp)]
