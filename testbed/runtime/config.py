"""A worker's typed configuration: its lowered program and where its peers are. Written by the
orchestrator (emu/train.py) as JSON, read and validated by the worker (runtime/worker.py) before it
starts; a malformed file stops the worker with one line. Standard library only (role images)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Literal

from testbed.program import Program, ProgramError, program_from_dict


@dataclass(frozen=True)
class Endpoint:
    ip: str
    port: int


@dataclass(frozen=True)
class PrefillConfig:
    """BubbleTea's inference model on this worker: its name and layers (a job pauses at layer boundaries),
    and the decode process of each DC that finished KV caches go to (real compute: the real cache; modeled
    compute with `bubbletea.ship_kv`: `kv_bytes_per_token` x the prompt's tokens of filler, the inference
    model's cache over the emulation's scale k)."""

    model: str
    layers: int
    decode: dict[str, Endpoint]
    kv_bytes_per_token: float = 0.0  # modeled compute: bytes shipped per prompt token (0: nothing shipped)
    kv_connections: int = 1  # TCP connections per home DC (the WAN links' multi-TCP count)


@dataclass(frozen=True)
class WorkerConfig:
    program: Program
    ip: str  # the address this worker listens on (its emulated host's)
    peers: dict[str, Endpoint]  # every group it exchanges messages with: pipe neighbours and all-reduce peers
    scale: float  # the emulation's k: real-world bytes / k go on the wire
    compute: Literal["modeled", "torch"]
    dp: int
    host_index: int  # the host's index in its DC (torch on GPUs: its pinned device)
    sidecars: dict[str, str]  # peer group -> the Atlas sidecar's socket for the pipe to it (temporal sharing)
    torch: dict | None = None  # the real model's shape and optimizer for `compute: torch`
    optimizer_s: float = 0.0  # the cost model's AdamW step after the all-reduce (modeled compute waits it)
    bubbletea: str | None = None  # the BubbleTea service's socket
    prefill: PrefillConfig | None = None  # with `bubbletea`: what its jobs run
    user_timeout_s: float = 30.0  # TCP_USER_TIMEOUT of its connections: data unacknowledged this long ends the run
    realtime: str = "off"  # the CPU class of its timed threads: auto | on | off (runtime/cpuclass.py)
    # its machine's CLOCK_MONOTONIC minus the orchestrator's (a cluster's own clocks, testbed/cluster/clock.py): data
    # chunks carry their send time on the orchestrator's clock, so a receiver on another machine reads it on its own
    clock_offset_s: float = 0.0
    predictive: bool = False  # announce WAN sends to the sidecars as their compute starts (runtime/announce.py)

    def to_json(self) -> str:
        d = asdict(self)
        d["program"] = json.loads(self.program.to_json())
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        try:
            d = json.loads(text)
            program = program_from_dict(d.pop("program"))
            peers = {str(k): Endpoint(str(v["ip"]), int(v["port"])) for k, v in d.pop("peers").items()}
            pf = d.pop("prefill", None)
            prefill = None if pf is None else PrefillConfig(str(pf["model"]), int(pf["layers"]), {
                str(k): Endpoint(str(v["ip"]), int(v["port"])) for k, v in pf["decode"].items()},
                float(pf.get("kv_bytes_per_token", 0.0)), int(pf.get("kv_connections", 1)))
            cfg = cls(program=program, peers=peers, prefill=prefill, **d)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ProgramError(f"malformed worker config: {e}") from None
        if cfg.compute not in ("modeled", "torch") or cfg.scale <= 0 or cfg.dp < 1 \
                or cfg.realtime not in ("auto", "on", "off") or not isinstance(cfg.clock_offset_s, (int, float)) \
                or not math.isfinite(cfg.clock_offset_s):
            raise ProgramError(f"malformed worker config: compute {cfg.compute!r}, scale {cfg.scale}, dp {cfg.dp}, "
                               f"realtime {cfg.realtime!r}, clock_offset_s {cfg.clock_offset_s!r}")
        return cfg
