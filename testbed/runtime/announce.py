"""The worker's half of the predictive Atlas sidecar: which WAN sends a compute produces, announced as it starts.

A pipeline worker's program is known in advance: a Send carries the output of the compute just before it (a
forward's activations, a backward's gradients). With `network.sidecar: predictive` a worker announces each WAN
send to its link's sidecar as the compute that produces it STARTS, with `at`, when that compute will end and the
send be issued (modeled compute: exact; torch: the cost model's time). The sidecar ranks the transfer then, so the
HTB change is made before the first byte reaches the shaper and a handover at a start costs no notice round trip
(the simulator's predictive sidecar ranks a transfer the instant it is issued). The worker still tells it when the
send is issued (`issue`) and the receiver when the last byte arrived (`end`): an end is observed, not predicted.

Standard library and testbed.program only (a role process imports it).
"""

from __future__ import annotations

from collections.abc import Sequence

from testbed.program import Backward, BackwardWeight, Forward, Send

COMPUTE = (Forward, Backward, BackwardWeight)


def transfer_id(replica: int, kind: bytes, it: int, mb: int) -> str:
    """How a transfer's announcement, issue and end notices name it to the sidecar (`mb`: the wire's field)."""
    return f"{replica}{kind.decode()}{it}.{mb}"


def producers(steps: Sequence[object]) -> dict[int, tuple[int, ...]]:
    """Compute step index -> the indices of the Sends that carry its output: every Send belongs to the last compute
    before it in the program. A Send with no compute before it has no producer and is not announced (its
    transfer is ranked when it is issued, as the reactive sidecar ranks every transfer)."""
    out: dict[int, list[int]] = {}
    last = -1
    for i, st in enumerate(steps):
        if isinstance(st, COMPUTE):
            last = i
        elif isinstance(st, Send) and last >= 0:
            out.setdefault(last, []).append(i)
    return {i: tuple(v) for i, v in out.items()}


def announcement(st: Send, replica: int, it: int, wire_mb: int, at: float) -> dict:
    """The notice announcing send `st` (its transfer's id uses `wire_mb`, the data header's microbatch field)."""
    return {"op": "announce", "replica": replica, "mb": st.microbatch, "kind": st.kind,
            "id": transfer_id(replica, st.kind.encode(), it, wire_mb), "at": at}

