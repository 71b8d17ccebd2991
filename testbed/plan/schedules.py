"""Pipeline schedules as plain data: the ordered compute actions of each stage.

Like torch.distributed.pipelining, a schedule is a list of actions per rank, so it can be printed,
tested and executed by the simulator and by emulated workers alike. With virtual stages (Megatron's
interleaved 1F1B) each stage holds V model chunks and an action names the chunk it runs.
"""

from __future__ import annotations

from typing import Literal, NamedTuple


class Action(NamedTuple):
    op: Literal["F", "B"]
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


def interleaved_warmup(stage: int, pp: int, m: int, v: int) -> int:
    """Forwards before the steady one-forward-one-backward phase of Megatron-LM's interleaved 1F1B, counted in
    (microbatch, chunk) steps: 2 (pp - stage - 1) + (v - 1) pp, all m v of them when that is more
    (NVIDIA/Megatron-LM, megatron/core/pipeline_parallel/schedules.py, get_pp_rank_microbatches as
    forward_backward_pipelining_with_interleaving calls it, microbatch_group_size_per_vp_stage = pp)."""
    return min(2 * (pp - stage - 1) + (v - 1) * pp, m * v)


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
    if v > 1:
        why = check_interleaving(pp, m, v)
        if name != "1f1b" or why:
            raise ValueError(why or f"virtual stages need the 1f1b schedule, not {name}")
        return [interleaved(s, pp, m, v) for s in range(pp)]
    if name == "1f1b" and extra:
        return [one_f_one_b(s, pp, m, extra[s]) for s in range(pp)]
    return [SCHEDULES[name](s, pp, m) for s in range(pp)]
