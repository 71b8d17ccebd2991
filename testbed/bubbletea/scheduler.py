"""The BubbleTea prefill scheduler: policy (which bubble serves which request) over a plain
mechanism (per-group windows consumed front to back). Requests are handled in arrival order.

A request's state machine: arrived -> placed (whole, or in chunks on one group) -> prefilled ->
KV cache shipped to its decode pool; or arrived -> queued in the fallback pool (finite, FIFO:
testbed/bubbletea/pool.py) -> prefilled there, when no bubble lets it finish within its TTFT SLO
(a bubble that misses the SLO still wins if it finishes before the pool would). Placement never
overlaps a training op: each window is a bubble shrunk by the guard band at both ends, and a group
serves one prompt at a time.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.bubbletea.bubbles import Bubble
from testbed.bubbletea.pool import FallbackPool
from testbed.bubbletea.trace import Request

MIN_CHUNK_TOKENS = 128
MAX_CHUNKS = 64
CANDIDATES = 16  # groups considered per request, earliest-available first


@dataclass
class GroupCost:
    """Prefill costs on one group (its DC's GPU type): full prompt, and a chunk after `done` tokens."""

    full: Callable[[int], float]
    chunk: Callable[[int, int], float]
    max_tokens: int  # KV capacity left by training on this group's GPUs


# Why a request went to the pool (requests.csv `pool_reason`): no group holds its prompt beside training; no
# predicted bubble before the horizon holds it; its bubble would end past the SLO; a job of it did not run in its
# iteration and the re-plan gave up; placed in bubbles but not all run when the run ended; not decided before then
POOL_REASONS = ("too_large", "no_bubble", "late", "skipped", "not_run", "run_end")


@dataclass
class Placement:
    request: Request
    home_dc: str
    gpu: str = "fallback"
    dc: str = ""
    intervals: list[tuple[float, float, int]] = field(default_factory=list)  # (start, end, tokens)
    kv_ready_s: float = 0.0
    fallback: bool = True
    end_s: float = 0.0
    queue_s: float = 0.0  # wait in the fallback pool's queue (0 when served in bubbles)
    pool_reason: str = ""  # why not in bubbles (POOL_REASONS); empty when served there

    @property
    def start_s(self) -> float:
        return self.intervals[0][0] if self.intervals else self.request.arrival_s + self.queue_s

    @property
    def ttft_s(self) -> float:
        return self.end_s - self.request.arrival_s


class GroupWindows:
    """One group's bubbles as windows [start + guard, end - guard], consumed front to back."""

    def __init__(self, key: tuple[str, str], bubbles: list[Bubble], guard: float, min_s: float) -> None:
        self.gpu, self.dc = key
        self.windows = [(b.start_s + guard, b.end_s - guard) for b in sorted(bubbles, key=lambda b: b.start_s)
                        if b.end_s - b.start_s - 2 * guard > min_s]
        self.ends = [w[1] for w in self.windows]
        self.longest = max((b - a for a, b in self.windows), default=0.0)
        self.i = 0
        self.cursor = self.windows[0][0] if self.windows else float("inf")

    def available(self, t: float) -> tuple[float, float] | None:
        """The current window's usable part at or after t, skipping windows already over."""
        self.i = max(self.i, bisect.bisect_right(self.ends, max(t, self.cursor), lo=self.i))
        if self.i >= len(self.windows):
            return None
        a, b = self.windows[self.i]
        return max(a, t, self.cursor), b

    def walk(self, t: float, tokens: int, cost: GroupCost, horizon: float) -> list[tuple[float, float, int]] | None:
        """Where a prompt would run from t on: whole, in the first window it fits; chunked across
        successive windows only if it is longer than every window of this group."""
        whole = cost.full(tokens)
        cur = max(t, self.cursor)
        if whole <= self.longest:
            for j in range(self.i, len(self.windows)):
                a, b = self.windows[j]
                a = max(a, cur)
                if a >= horizon:
                    return None
                if b - a >= whole:
                    return [(a, a + whole, tokens)]
            return None
        out: list[tuple[float, float, int]] = []
        done, j = 0, self.i
        while j < len(self.windows) and done < tokens and len(out) < MAX_CHUNKS:
            a, b = self.windows[j]
            a = max(a, cur)
            if a >= horizon:
                return None
            left = tokens - done
            k = left if b - a >= cost.chunk(done, left) else self._largest_chunk(done, left, b - a, cost)
            if k:
                out.append((a, a + cost.chunk(done, k), k))
                done += k
            j += 1
        return out if done == tokens else None

    @staticmethod
    def _largest_chunk(done: int, left: int, room: float, cost: GroupCost) -> int:
        lo, hi = 0, left
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cost.chunk(done, mid) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo if lo >= min(MIN_CHUNK_TOKENS, left) else 0

    def commit(self, intervals: list[tuple[float, float, int]]) -> None:
        self.cursor = intervals[-1][1]
        self.i = bisect.bisect_left(self.ends, self.cursor, lo=self.i)


def schedule(
    requests: list[Request],
    bubbles: list[Bubble],
    *,
    costs: dict[tuple[str, str], GroupCost],  # per group (gpu, dc)
    pool: FallbackPool | None,  # None: leave what the bubbles do not serve unplaced (the online planner)
    kv_time: Callable[[str, str, int], float],  # (from dc, to dc, tokens) -> seconds
    home: Callable[[Request], str],
    guard_s: float,
    slo_s: float,
    horizon_s: float,
    since: dict[int, float] | None = None,  # request id -> when its SLO started, if not at its arrival
) -> list[Placement]:
    by_group: dict[tuple[str, str], list[Bubble]] = {}
    for b in bubbles:
        by_group.setdefault((b.gpu, b.dc), []).append(b)
    groups = [GroupWindows(k, v, guard_s, 0.0) for k, v in sorted(by_group.items()) if k in costs]
    largest = max((c.max_tokens for c in costs.values()), default=0)
    heap = [(g.cursor, n) for n, g in enumerate(groups) if g.windows]
    heapq.heapify(heap)
    out: list[Placement] = []
    for req in requests:
        pl = Placement(req, home(req))
        popped, best = [], None
        while heap and len(popped) < CANDIDATES:
            _, n = heapq.heappop(heap)
            g = groups[n]
            if g.available(req.arrival_s) is None:
                continue  # no bubbles left on this group
            popped.append(n)
            cost = costs[(g.gpu, g.dc)]
            if req.prompt_tokens > cost.max_tokens:
                continue
            iv = g.walk(req.arrival_s, req.prompt_tokens, cost, horizon_s)
            if iv is None:
                continue
            ready = iv[-1][1] + kv_time(g.dc, pl.home_dc, req.prompt_tokens)
            if best is None or (ready, n) < best[0]:
                best = ((ready, n), iv)
        bubble_end = best[1][-1][1] if best is not None else float("inf")
        queued = None
        origin = since.get(req.request_id, req.arrival_s) if since else req.arrival_s
        pl.pool_reason = ("too_large" if req.prompt_tokens > largest else "no_bubble") if best is None else "late"
        if bubble_end - origin > slo_s:
            if pool is None:
                best = None
            else:
                queued = pool.peek(req.arrival_s, req.prompt_tokens, pl.home_dc)
                if bubble_end < queued.end_s:
                    queued = None  # late either way: the bubble is sooner
        if queued is None and best is not None:
            (ready, n), iv = best
            g = groups[n]
            g.commit(iv)
            pl.gpu, pl.dc, pl.intervals, pl.kv_ready_s, pl.fallback = g.gpu, g.dc, iv, ready, False
            pl.end_s, pl.pool_reason = iv[-1][1], ""  # late in bubbles still: sooner than the pool
        elif pool is not None:
            served = queued or pool.peek(req.arrival_s, req.prompt_tokens, pl.home_dc)
            pool.commit(served)
            pl.dc, pl.end_s, pl.queue_s = served.dc, served.end_s, served.queue_s(req.arrival_s)
            pl.kv_ready_s = served.end_s + kv_time(served.dc, pl.home_dc, req.prompt_tokens)
        for n in popped:
            heapq.heappush(heap, (max(groups[n].cursor, req.arrival_s), n))
        out.append(pl)
    return out
