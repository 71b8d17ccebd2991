"""Experiment spec: a topology, a workload, the schedulers to compare and the sweep."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from testbed.costs.calibration import load_calibration, register_gpus
from testbed.errors import SpecError
from testbed.spec.bounds import (
    FILL_BATCH,
    FILL_DEADLINE_S,
    FILL_JOBS_PER_S,
    FILL_PASSES,
    FILL_SEQ_LEN,
    GUARD_MS,
    LABEL,
    LR,
    RATE_SCALE,
    REPLICAS,
    SCALE,
    SEED,
    TRACE_START_S,
    TTFT_SLO_MS,
)
from testbed.spec.mechanisms import parse_scheduler
from testbed.spec.topology import Strict, Topology
from testbed.spec.workload import Workload


class NetworkOptions(Strict):
    """How transfers use TCP. The NCCL defaults are those of its socket transport: NCCL_SOCKET_NTHREADS=1 and
    NCCL_NSOCKS_PERTHREAD=1 outside AWS (AWS ENA: 2 and 8), NCCL_NCHANNELS_PER_NET_PEER=2 channels per peer
    for point-to-point sends (NCCL's src/transport/net_socket.cc and src/graph/paths.cc)."""

    max_tcp_connections: Annotated[int, Field(gt=0, le=1024)] = 128  # multi-TCP's cap per transfer
    nccl_socket_threads: Annotated[int, Field(gt=0, le=16)] = 1  # NCCL_SOCKET_NTHREADS
    nccl_sockets_per_thread: Annotated[int, Field(gt=0, le=64)] = 1  # NCCL_NSOCKS_PERTHREAD
    nccl_channels_per_peer: Annotated[int, Field(gt=0, le=32)] = 2  # NCCL_NCHANNELS_PER_NET_PEER
    # the order in which transfers take turns on a WAN link under temporal sharing (README: turn orders)
    turn_order: Literal["auto", "replica", "fcfs", "microbatch"] = "auto"
    # how the Atlas sidecar learns who holds a link next: `predictive` from the plan's schedule (a transfer ranked
    # as the compute producing it starts, so a start costs no notice; an end observed as its last byte leaves, one
    # SIDECAR_REACTION_S later), `reactive` from the workers' notices (the sender's as it issues, the receiver's
    # once the last byte arrived, each SIDECAR_REACTION_S before it takes effect); `auto`: predictive in the
    # simulator, reactive on the emulated WAN (where predictive runs agreed less well with their prediction: -3.6 %
    # against -2.6 % on emu-3dc, worst -5.3 % against -3.9 % on ten random topologies, docs/training.md "Predictive
    # vs reactive"); an explicit `predictive` runs there too (testbed/runtime/announce.py)
    sidecar: Literal["auto", "predictive", "reactive"] = "auto"
    # net.ipv4.tcp_slow_start_after_idle: Linux restarts a connection idle for an RTO from its initial window.
    # Off by default, as deployments that move data across long round trips set it; the simulator does not
    # model slow start, so turning it on makes emulated runs slower than the simulator predicts (README).
    tcp_slow_start_after_idle: bool = False
    # net.ipv4.tcp_congestion_control on every emulated host (the simulator's model: each connection fills its
    # window, flows share a link fairly); Linux's default is cubic, whatever the machine running the emulation uses
    tcp_congestion_control: Literal["cubic", "reno", "bbr"] = "cubic"
    # each emulated host's initial congestion window across a WAN link (a route per peer DC, initcwnd): `window`
    # opens it to the link's window (or bandwidth-delay product, if smaller), as the simulator's window-bound
    # model has every connection from the start
    # (and a long-running job's connections are after warm-up); `kernel` keeps Linux's 10 segments, from which
    # HyStart and cubic took 2-4 iterations to open the windows (docs/fidelity.md); `auto`: `window`, or
    # `kernel` with tcp_slow_start_after_idle, whose restart from a window-sized initial window would be none
    tcp_initial_window: Literal["auto", "window", "kernel"] = "auto"
    # how long a worker's connection may hold data the far end has not acknowledged before the run ends with one
    # line naming its link (TCP_USER_TIMEOUT on every worker connection): a WAN link that carries nothing for this
    # long is down, not slow. Linux's own retries give up only after about 15 minutes (tcp_retries2).
    tcp_user_timeout_s: Annotated[float, Field(ge=1, le=3600)] = 30.0

    @model_validator(mode="after")
    def _restart(self) -> NetworkOptions:
        if self.tcp_slow_start_after_idle and self.tcp_initial_window == "window":
            raise ValueError("tcp_initial_window: 'window' restarts an idle connection at its whole window, which "
                             "undoes tcp_slow_start_after_idle; set tcp_initial_window: kernel (or auto)")
        return self

    @property
    def host_tcp(self) -> dict:
        """The emulated hosts' TCP settings, as `testbed.emu.build.up` takes them."""
        return {"slow_start_after_idle": self.tcp_slow_start_after_idle,
                "congestion_control": self.tcp_congestion_control,
                "warm_windows": warm_windows(self.tcp_initial_window, self.tcp_slow_start_after_idle),
                "user_timeout_s": self.tcp_user_timeout_s}

    @property
    def nccl_sockets(self) -> int:
        """TCP connections one NCCL channel opens to a peer (NCCL caps it at 64)."""
        return min(64, self.nccl_socket_threads * self.nccl_sockets_per_thread)


def warm_windows(initial_window: str, slow_start_after_idle: bool) -> bool:
    """Do emulated connections start with their window open (`NetworkOptions.tcp_initial_window`)? `auto`: unless
    slow start after idle is on."""
    if initial_window == "auto":
        return not slow_start_after_idle
    return initial_window == "window"


class FillOptions(Strict):
    """Fill work: jobs without a latency SLO (PipeFill-style batch inference, evaluation, embedding) in the idle
    time training and SLO-bound prefill leave (testbed/bubbletea/fill.py). A job is `passes` forward passes of
    `model` over `batch` sequences of `seq_len` tokens, due `deadline_s` after it arrives."""

    # `generator`: Poisson arrivals at jobs_per_s of the shape below (seeded); or a CSV with the columns
    # arrival_s, batch, seq_len, passes, deadline_s (relative to the experiment file)
    trace: str = "generator"
    model: str = "llama2-7b"
    jobs_per_s: FILL_JOBS_PER_S = 4.0
    batch: FILL_BATCH = 8
    seq_len: FILL_SEQ_LEN = 512
    passes: FILL_PASSES = 16
    deadline_s: FILL_DEADLINE_S = 30.0


class BubbleTeaOptions(Strict):
    """Prefill serving in bubbles. The inference model is sharded over each training TP group."""

    trace: str = "synthetic"  # `synthetic`, or an Azure-format CSV (relative to the experiment file)
    rate_scale: RATE_SCALE = 1.0  # > 1 compresses the trace's time: more requests/s
    trace_start_s: TRACE_START_S = 0.0
    model: str = "llama2-7b"
    # what times a prefill pass (testbed/costs/prefill_model.py): `ops`, the training's operators at the pass's
    # shape; `curve`, a roofline fitted per GPU (A100, H100, H200 only). Both fitted on measured prompt times.
    prefill_model: Literal["ops", "curve"] = "ops"
    guard_ms: GUARD_MS = 1.0
    ttft_slo_ms: TTFT_SLO_MS = 2000.0
    # GPUs of the dedicated prefill pool that serves what the bubbles do not (one FIFO queue);
    # None: enough to carry the trace's mean load at its own rate (testbed/bubbletea/pool.py)
    fallback_gpus: Annotated[int, Field(gt=0, le=1_000_000)] | None = None
    # the simulator's timing noise: coefficients of variation of lognormal factors (mean 1) on compute times
    # and on transfer delays. Above 0, BubbleTea runs its online planner against noisy iterations
    # (testbed/bubbletea/realised.py), so training can wait for prefill; the emulated runs measured about
    # 0.06 and 0.10 (docs/bubbletea.md). 0 and 0 (default): exact bubbles, a static placement, no slowdown.
    jitter_compute_cv: Annotated[float, Field(ge=0, le=1)] = 0.0
    jitter_wan_cv: Annotated[float, Field(ge=0, le=1)] = 0.0
    # the emulated run with modeled compute: ship each bubble-served request's KV cache (its modeled size over the
    # emulation's scale) through the emulated WAN to its home DC's decode process, in the KV class on the links and
    # at the lowest CPU priority on the hosts (docs/bubbletea.md); false: the caches do not cross the emulated WAN
    ship_kv: bool = True
    # fill work in what prefill leaves (None: none); the simulator without noise only, for now
    fill: FillOptions | None = None

    @model_validator(mode="after")
    def _fill_exact(self) -> BubbleTeaOptions:
        if self.fill is not None and (self.jitter_compute_cv or self.jitter_wan_cv):
            raise ValueError("fill: not yet with timing noise (the online planner does not place fill work); set "
                             "jitter_compute_cv and jitter_wan_cv to 0, or remove bubbletea.fill")
        return self


class MultiTcpOptions(Strict):
    """A WAN throughput experiment: parallel TCP connections on each WAN link (the motivation for Atlas)."""

    connections: Annotated[list[Annotated[int, Field(gt=0, le=64)]], Field(min_length=1)] = [1, 2, 4, 8, 16]
    seconds: Annotated[float, Field(gt=0, le=60)] = 3.0
    # left out before the measured seconds of the workers' connections (not iperf3's): slow start from 10
    # segments to the window and the send buffer's autotuning, ten round trips at 100 ms
    warmup_s: Annotated[float, Field(ge=0, le=60)] = 1.0
    links: list[int] | None = None  # indices into topology.links (default: the first)


class EmulationOptions(Strict):
    backend: Literal["netns", "docker", "mininet", "containernet"] = "netns"
    scale: SCALE = 0.0  # 0 = auto (fastest link at 200 Mbit/s); testbed.emu.scale checks it against the topology
    delay: Literal["auto", "netem", "nfqueue", "none"] = "auto"
    prefix: str | None = None  # None: the first free gdtb<N> (testbed/emu/owner.py)
    compute: Literal["modeled", "torch"] = "modeled"  # torch: a real GPT stage per worker (CPU here)
    lr: LR = 3e-3  # torch compute's AdamW learning rate
    # the CPU class of delay lines, Atlas sidecars and the workers' timed threads: real-time round robin where the
    # system allows it (auto), required (on), or nice values only (off): testbed/runtime/cpuclass.py,
    # docs/reliability.md "Real-time class"
    realtime: Literal["auto", "on", "off"] = "auto"

    @field_validator("realtime", mode="before")
    @classmethod
    def _realtime(cls, v: object) -> object:
        """YAML reads a bare on/off as a boolean: take it as the mode it spells."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"gdtb[a-z0-9]{1,4}", v):
            raise ValueError(f"{v!r} is not a testbed prefix; use gdtb followed by 1-4 lowercase letters/digits")
        return v


class CostOptions(Strict):
    """The compute model's inputs beyond the zoo: a calibration file (bench/gpu_profile.py writes one) and
    users' own GPUs (`NAME: {peak_tflops, memory_gb, hbm_gbps, nvlink_gbps, like, ...}`, see
    testbed/costs/gpu_specs.py). Both are registered before the topology is read, so DCs may name them."""

    calibration: str | None = None
    gpus: dict[str, dict[str, float | int | str]] = {}


class Experiment(Strict):
    name: LABEL = "experiment"
    costs: CostOptions = CostOptions()
    topology: Topology
    workload: Workload = Workload()
    schedulers: Annotated[list[str], Field(min_length=1)] = ["pp-wan", "atlas"]
    iterations: Annotated[int, Field(gt=0, le=1000)] = 1
    seed: SEED = 0
    network: NetworkOptions = NetworkOptions()
    bubbletea: BubbleTeaOptions = BubbleTeaOptions()
    sweep: dict[str, list[float | int | str]] = {}
    timeline: Literal["all", "first-point", "none"] = "all"
    # replicas are symmetric in the simulator: keep the timeline of the first N (None = all)
    timeline_replicas: REPLICAS | None = None
    emulation: EmulationOptions = EmulationOptions()
    multitcp: MultiTcpOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _register_gpus(cls, data: object) -> object:
        """Register `costs.gpus` and `costs.calibration` first: the topology's DCs may name those GPUs."""
        costs = data.get("costs") if isinstance(data, dict) else None
        if isinstance(costs, dict):
            try:
                if costs.get("calibration"):
                    load_calibration(str(costs["calibration"]))
                if costs.get("gpus"):
                    register_gpus(costs["gpus"], "costs.gpus")
            except SpecError as e:
                raise ValueError(str(e)) from None
        return data

    @field_validator("schedulers")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        for name in v:
            parse_scheduler(name)  # raises ValueError naming the valid choices
        if len(set(v)) != len(v):
            raise ValueError("a scheduler is listed twice; list each once")
        return v

    @model_validator(mode="after")
    def _multitcp_links(self) -> Experiment:
        n = len(self.topology.links)
        links = self.multitcp.links if self.multitcp is not None and self.multitcp.links else []
        for i, li in enumerate(links):
            if not 0 <= li < n:
                raise ValueError(f"multitcp.links.{i}: {li} is not an index into topology.links; use 0 to {n - 1}")
        return self
