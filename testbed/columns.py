"""What every column of every CSV the testbed writes means, and its unit: one registry.

Tables and figures take their axis labels and number formats from here; `docs/outputs.md` shows it
(`python -m testbed.columns --write docs/outputs.md` regenerates that section, and a test checks it
is current and that every header the code writes is listed). A column missing here still prints and
plots, by its own name.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Column:
    name: str
    unit: str  # "" for names and counts; "share" for 0-1 fractions (printed as %)
    meaning: str


@dataclass(frozen=True)
class CsvFile:
    name: str
    written_by: str
    about: str
    columns: tuple[Column, ...]


def _cols(*specs: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*s) for s in specs)


_RUN = ("run_id", "", "one simulated or emulated run: `p<sweep point>-<scheduler>` (multitcp: `-<link>-n<conns>`)")
_SOURCE = ("source", "", "`sim` (the simulator) or `emu` (measured on the emulated WAN)")

SUMMARY = CsvFile("summary.csv", "`testbed sim`, `testbed experiment run`",
                  "one row per sweep point, scheduler and source", _cols(
    _RUN, _SOURCE,
    ("scheduler", "", "what was run: a base design (`dp-wan`, `pp-wan`, `atlas`) with `+mechanism`s"),
    ("model", "", "the trained model (model zoo name)"),
    ("dcs", "", "DCs the plan uses, `|`-separated, in pipeline order"),
    ("gpus", "GPUs", "GPUs of the training job (tp x pp x dp)"),
    ("tp", "", "tensor-parallel degree (inside a node)"),
    ("pp", "", "pipeline stages"),
    ("dp", "", "data-parallel replicas"),
    ("microbatches", "", "microbatches per replica per iteration (the largest share with batch_split: speed)"),
    ("wan_latency_ms", "ms", "mean one-way latency of the WAN links the plan's traffic crosses"),
    ("wan_gbps", "Gbit/s", "smallest real-world capacity among those links"),
    ("tcp_connections", "", "TCP connections per stage pair and direction on the WAN (Atlas's multi-TCP)"),
    ("iteration_s", "s", "time of one training iteration (mean over the steady iterations)"),
    ("tokens_per_s", "tokens/s", "training throughput: global batch x sequence length / iteration_s"),
    ("tokens_per_s_per_gpu", "tokens/s", "tokens_per_s / gpus"),
    ("mfu", "share", "model FLOPs utilisation, derived: the iteration's model FLOPs (forward and backward, no "
                     "recomputation: testbed/costs/operators.py model_flops_per_token) / iteration_s / gpus / the "
                     "GPUs' mean dense bf16 peak; with a typed workload.mfu it is what that MFU gives after "
                     "bubbles and communication"),
    ("model_tflops_per_gpu", "TFLOP/s", "the iteration's model FLOPs / iteration_s / gpus"),
    ("token_efficiency", "x", "tokens synchronous training needs for a loss / tokens this scheduler's family needs "
                              "(1 for synchronous ones; `workload.token_efficiency`, else the family's published "
                              "default: testbed/plan/efficiency.py, docs/families.md)"),
    ("effective_tokens_per_s", "tokens/s", "tokens_per_s x token_efficiency: throughput in synchronous-training "
                                           "tokens, the fair comparison across families"),
    ("wan_bytes", "bytes", "real-world bytes that cross the WAN per iteration, averaged over a sync period: every "
                           "group's Sends on WAN pipes plus the cross-DC exchanges of its all-reduces and outer syncs, "
                           "from the lowered programs (testbed/analysis/wanbytes.py; the same in both engines)"),
    ("gpu_util", "share", "share of GPU time computing: training forward/backward plus BubbleTea prefill and fill "
                          "work"),
    ("train_util", "share", "share of GPU time in training forward/backward only"),
    ("prefill_util", "share", "share of GPU time in BubbleTea prefill"),
    ("prefill_work_util", "share", "BubbleTea: prefill as useful work: its FLOPs as the GPU time they would take at "
                                   "the training's MFU (workload.mfu), as a share of GPU time"),
    ("useful_util", "share", "BubbleTea: train_util + prefill_work_util (+ fill_work_util) (gpu_util counts prefill "
                             "and fill by time occupied)"),
    ("prefill_mfu", "share", "BubbleTea: the MFU prefill achieved in the bubbles (its FLOPs / (busy time x peak))"),
    ("bubble_frac", "share", "share of GPU time idle (neither computing, all-reducing, prefilling nor filling)"),
    ("lower_bound_s", "s", "iteration time of the same placement with a WAN as good as the DC fabric"),
    ("wan_min_s", "s", "time the busiest WAN direction needs just to carry one iteration's bytes at capacity"),
    ("best_baseline", "", "per source and sweep point: the fastest scheduler that is not Atlas (mechanisms "
                          "included); empty where the point has none"),
    ("speedup_vs_best", "x", "best_baseline's iteration time / this row's (above 1: faster than every baseline)"),
    ("train_slowdown", "share", "BubbleTea: iteration time with prefill / without - 1 (0 = training not delayed); "
                                "emulated: the median over the steady iterations of each against itself replayed "
                                "without training's waits for prefill (testbed/bubbletea/without_prefill.py)"),
    ("train_slowdown_p25", "share", "BubbleTea, emulated: 25th percentile of the steady iterations' slowdown (spread)"),
    ("train_slowdown_p75", "share", "BubbleTea, emulated: 75th percentile of the steady iterations' slowdown (spread)"),
    ("train_slowdown_vs_alone", "share", "BubbleTea, emulated (written only then): median iteration / the separate "
                                         "run without BubbleTea's median - 1; sees what the in-run replay cannot (KV "
                                         "caches on the wire, the emulation's CPU) and the two runs' difference"),
    ("train_slowdown_vs_alone_p25", "share", "BubbleTea, emulated: 25th percentile of the steady iterations against "
                                             "the separate run's median"),
    ("train_slowdown_vs_alone_p75", "share", "BubbleTea, emulated: 75th percentile of the same"),
    ("ttft_p50_ms", "ms", "BubbleTea: median time to first token (bubble-served and fallback requests)"),
    ("ttft_p99_ms", "ms", "BubbleTea: 99th-percentile time to first token"),
    ("ttft_bubble_p50_ms", "ms", "BubbleTea: median TTFT of the requests prefilled in bubbles"),
    ("ttft_bubble_p99_ms", "ms", "BubbleTea: 99th-percentile TTFT of the requests prefilled in bubbles"),
    ("ttft_pool_p50_ms", "ms", "BubbleTea: median TTFT of the requests the fallback pool served (queueing included)"),
    ("ttft_pool_p99_ms", "ms", "BubbleTea: 99th-percentile TTFT of the pool-served requests (queueing included)"),
    ("pool_wait_p99_ms", "ms", "BubbleTea: 99th-percentile wait in the fallback pool's FIFO queue"),
    ("slo_attainment", "share", "BubbleTea: share of requests whose TTFT met the SLO (`bubbletea.ttft_slo_ms`)"),
    ("goodput_rps", "requests/s", "BubbleTea: requests per second whose TTFT met the SLO"),
    ("prefill_tokens_per_s", "tokens/s", "BubbleTea: prompt tokens prefilled inside bubbles per second"),
    ("served_in_bubbles", "share", "BubbleTea: share of requests prefilled inside bubbles (the rest: fallback pool)"),
    ("requests", "", "BubbleTea: requests offered during the run"),
    ("request_rate", "requests/s", "BubbleTea: offered request rate"),
    ("fallback", "", "BubbleTea: requests served by the fallback pool"),
    ("fallback_gpus", "GPUs", "BubbleTea: GPUs of the fallback pool (`bubbletea.fallback_gpus`; default: the trace's "
                              "mean load at its own rate)"),
    ("pool_util", "share", "BubbleTea: share of the fallback pool's GPU time spent prefilling"),
    ("prefill_skipped", "share", "BubbleTea, emulated: share of the jobs handed to workers that did not run in their "
                                 "iteration (no gap left that they fitted; re-planned)"),
    ("scale", "", "emulation scale k: link rates, windows and bytes were divided by k (1 in the simulator)"),
    ("sweep", "", "this row's sweep point: `key=value` pairs, `;`-separated (empty without a sweep)"),
    ("degraded", "", "why an emulated run is not what was asked (e.g. the Atlas sidecar died), else empty"),
    ("status", "", "`ok`, or `infeasible: <why>` for a sweep point and scheduler that could not run (no numbers)"),
    ("kv_wan_bytes", "bytes", "BubbleTea, simulated, or emulated with shipped KV caches (these six written only "
                              "then, after status; emulated: bytes and kv_ship_* only, measured): KV-cache bytes "
                              "that bubble-served prefill sent over WAN links (to home DCs elsewhere; the model's "
                              "size, not over k)"),
    ("kv_wan_gbps", "Gbit/s", "BubbleTea: the busiest link's KV-cache bytes over the run, as mean Gbit/s"),
    ("kv_wan_link", "", "BubbleTea: that link, `<from dc>><to dc>`"),
    ("kv_wan_link_share", "share", "BubbleTea: kv_wan_gbps as a share of that link's capacity"),
    ("kv_ship_p50_ms", "ms", "BubbleTea: median time from a prefill's end to its KV cache in a home DC across the "
                             "WAN (a flow sharing the link with training; docs/bubbletea.md)"),
    ("kv_ship_p99_ms", "ms", "BubbleTea: 99th percentile of that shipping time"),
    ("fill_util", "share", "BubbleTea with `bubbletea.fill` (these nine written only then, after the KV columns): "
                           "share of GPU time running fill work (jobs without a latency SLO; docs/bubbletea.md)"),
    ("fill_work_util", "share", "fill work's FLOPs as the GPU time they would take at the training's MFU, as a "
                                "share of GPU time (as prefill_work_util)"),
    ("fill_mfu", "share", "the MFU fill work achieved (its FLOPs / (busy time x peak))"),
    ("fill_jobs", "jobs", "fill jobs offered during the run"),
    ("fill_jobs_met", "jobs", "fill jobs whose every pass ended by their deadline"),
    ("fill_jobs_open", "jobs", "fill jobs unfinished at the run's end with their deadline after it"),
    ("fill_deadline_met", "share", "fill_jobs_met over the jobs decided (offered - open)"),
    ("fill_goodput_jobs_per_s", "jobs/s", "fill jobs finished by their deadline per second of the run"),
    ("fill_goodput_tokens_per_s", "tokens/s", "tokens of those jobs per second of the run"),
    ("kv_not_arrived", "caches", "BubbleTea, emulated with shipped KV caches (written only then): caches of "
                                 "bubble-served requests not at their decode process when the run stopped (the "
                                 "workers wait up to 5 s for them; docs/bubbletea.md)"),
    ("wan_stall_s", "s", "a WAN that changes (written only then, last): seconds during which some transfer waited "
                         "on a link that was down (docs/wan-change.md)"),
    ("wait_late_ms", "ms", "emulated (the timing health, written only then, last; docs/reliability.md): how late the "
                           "workers' timed waits (modeled compute) ended against what they asked, mean over every "
                           "wait of the steady iterations (early ones count 0)"),
    ("wait_late_host_ms", "ms", "emulated: the same mean on the emulated host whose waits ended latest"),
    ("wait_late_max_ms", "ms", "emulated: the latest single wait"),
    ("wake_late_ms", "ms", "emulated: how late the workers' threads resumed for a message, mean: a sender thread "
                           "idle until the message was handed to it, a receiver waiting for its last chunk"),
    ("delay_lag_ms", "ms", "emulated: mean (release - due time) of the packets the NFQUEUE delay line released during "
                           "the run (early ones count against late ones), on the WAN link where it is furthest from "
                           "0 (0 with netem)"),
    ("delay_lag_max_ms", "ms", "emulated: the latest release since the delay lines started (the point's network)"),
    ("cpu_steal", "share", "emulated: share of the machine's CPU time its hypervisor took during the run (/proc/stat)"),
    ("cpu_pressure", "share", "emulated: share of the run during which some task waited for a CPU "
                              "(/proc/pressure/cpu `some`; empty without PSI)"),
    ("run_queue", "", "emulated: runnable tasks per CPU, mean of samples every 0.1 s (/proc/stat procs_running)"),
    ("run_queue_max", "", "emulated: the most runnable tasks per CPU sampled"),
    ("shaping_drops", "packets", "emulated: packets the WAN links' qdiscs dropped during the run (tc -s); the "
                                 "simulator loses none, so any marks the run degraded"),
    ("bubbletea_cpu", "share", "emulated, with BubbleTea: share of the machine's CPU time (all its CPUs, over the run) "
                               "that BubbleTea's own processes took: the service, the decode processes, the KV "
                               "caches' delay lines and senders (their kernel packet path not included)"),
    ("timing_error", "share", "emulated: the iteration-time error the timing above can cause: the critical path's "
                              "waits x their lateness, its WAN crossings x the delay line's lag (or 2 lag / RTT), "
                              "plus the CPU steal, over the iteration time (docs/reliability.md)"),
    ("timing_budget", "share", "emulated: the timing error a run may carry (`--timing-budget`); above it the run is "
                               "marked degraded, and `--strict` fails"),
    ("cpu_class", "", "emulated: the CPU class the workers' timed threads and the delay lines ran in "
                      "(`emulation.realtime`, testbed/runtime/cpuclass.py): `realtime` (SCHED_RR), `nice`, or "
                      "`mixed (N of M realtime)`"),
))

MULTITCP = CsvFile("summary.csv (multitcp)", "`testbed experiment run` with a `multitcp:` section",
                   "one WAN link, one row per connection count and source", _cols(
    _RUN,
    ("source", "", "`sim` (the simulator's model), `emu` (the training workers' own connections on the emulated WAN: "
                   "window clamped to `window_kib`, after `multitcp.warmup_s` left out) or `emu-iperf3` (iperf3 on "
                   "the same link: the kernel's autotuned window, unclamped, slow start included)"),
    ("experiment", "", "experiment name"),
    ("link", "", "the WAN link, `<dc>-<dc>`"),
    ("wan_latency_ms", "ms", "configured one-way latency of the link"),
    ("wan_mbps", "Mbit/s", "emulated (scaled) link capacity"),
    ("tcp_connections", "", "parallel TCP connections (the workers' striped connections; iperf3's streams)"),
    ("window_kib", "KiB", "emulated TCP window per connection: the workers' clamp and the simulator's W"),
    ("throughput_mbps", "Mbit/s", "received goodput: measured (`emu`, `emu-iperf3`) or the simulator's model (`sim`)"),
    ("rtt_avg_ms", "ms", "mean ping RTT on the link (`sim`: twice the one-way latency)"),
    ("tcp_rtt_ms", "ms", "`emu`: the connections' mean smoothed RTT (TCP_INFO) over the measured seconds: the round "
                         "trip the data saw, queueing included (empty otherwise)"),
    ("scale", "", "emulation scale k"),
    ("delay_method", "", "how latency was emulated: `netem`, `nfqueue` (our delay line) or `none`"),
    ("sweep", "", "this row's sweep point (see summary.csv)"),
))

TIMELINE = CsvFile("timeline.csv", "`testbed sim`, `testbed experiment run`",
                   "one row per interval per GPU group (the tp GPUs of one stage of one replica)", _cols(
    _RUN, _SOURCE,
    ("iteration", "", "training iteration, from 0 (emulated runs leave out iteration 0: set-up, slow start)"),
    ("gpu", "", "GPU group, `s<stage>r<replica>`"),
    ("dc", "", "DC of the group"),
    ("stage", "", "pipeline stage"),
    ("replica", "", "data-parallel replica"),
    ("kind", "", "`fwd`, `bwd`, `send`, `recv`, `allreduce`, `optimizer` (the AdamW step), `outersync` (DiLoCo: "
                 "a fragment's outer gradient averaged across DCs; not GPU time), `prefill` (BubbleTea) "
                 "or `idle` (a bubble)"),
    ("microbatch", "", "microbatch of a fwd/bwd/send/recv (DiLoCo: inner step x microbatches + microbatch; the "
                       "fragment of an outersync; -1 otherwise)"),
    ("start_s", "s", "start, on the run's clock (iteration k starts after iterations 0..k-1)"),
    ("end_s", "s", "end (a recv ends when the last byte has arrived)"),
    ("bytes", "bytes", "real-world bytes of a transfer (0 for compute)"),
))

REQUESTS = CsvFile("requests.csv", "`+bubbletea` schedulers", "one row per prefill request", _cols(
    _RUN, _SOURCE,
    ("request_id", "", "request, in trace order"),
    ("arrival_s", "s", "arrival on the run's clock"),
    ("prompt_tokens", "tokens", "prompt length"),
    ("gpu", "", "GPU group that prefilled it, or `fallback`"),
    ("dc", "", "DC that prefilled it"),
    ("start_s", "s", "prefill start (first chunk)"),
    ("end_s", "s", "prefill end (last chunk): the first token; with real compute (emulated `compute: torch`) "
                   "the KV cache and first token at the home DC's decode process"),
    ("ttft_s", "s", "time to first token: end_s - arrival_s (pool-served: queueing included)"),
    ("chunks", "", "bubbles the prompt's prefill was split over"),
    ("in_bubble", "", "1 if prefilled inside bubbles, 0 if by the fallback pool"),
    ("home_dc", "", "DC whose decode pool receives the KV cache"),
    ("kv_bytes", "bytes", "KV-cache size shipped to the decode pool"),
    ("kv_ready_s", "s", "when the KV cache is in the decode pool (emulated: measured where caches are shipped, real "
                             "compute or `bubbletea.ship_kv`; empty if it had not arrived)"),
    ("queue_s", "s", "wait in the fallback pool's queue (0 when prefilled in bubbles)"),
    ("pool_reason", "", "why the fallback pool (empty when prefilled in bubbles): too_large (no group holds the "
                        "prompt beside training), no_bubble (no predicted bubble before the horizon holds it), "
                        "late (its bubble would end past the SLO), skipped (a job of it did not run in its "
                        "iteration and the re-plan found it late), not_run (placed in bubbles, its jobs not all "
                        "run when the run ended: planned past its last iteration), run_end (not decided before "
                        "the run ended)"),
))

KNEE = CsvFile("knee.csv", "`testbed sim` and `experiment run` with `+bubbletea` schedulers",
               "one row per BubbleTea scheduler and source: the knee of the offered-load sweep", _cols(
    ("scheduler", "", "a `+bubbletea` scheduler"), _SOURCE,
    ("knee_request_rate", "requests/s", "the highest offered rate of the sweep at which >= 99 % of requests met the "
                                        "SLO and training slowed by < 1 % (empty: no point qualified)"),
    ("sweep", "", "the knee's sweep point"),
    ("gpu_util", "share", "at the knee: GPU utilization, time occupancy (training + prefill + fill work)"),
    ("useful_util", "share", "at the knee: GPU utilization as useful work (prefill and fill FLOPs at the training's "
                             "MFU)"),
    ("goodput_rps", "requests/s", "at the knee: requests per second meeting the SLO"),
    ("slo_attainment", "share", "at the knee: share of requests meeting the SLO"),
    ("train_slowdown", "share", "at the knee: training slowdown"),
    ("served_in_bubbles", "share", "at the knee: share of requests prefilled in bubbles"),
    ("points", "", "offered rates the sweep had for this scheduler"),
    ("next_request_rate", "requests/s", "the next offered rate above the knee, where the criteria fail (empty: "
                                        "the knee is the sweep's last point, not bracketed)"),
    ("next_slo_attainment", "share", "SLO attainment at that rate"),
    ("next_train_slowdown", "share", "training slowdown at that rate"),
    ("fill_util", "share", "with `bubbletea.fill` (these five written only then): at the knee, fill work's share "
                           "of GPU time"),
    ("fill_work_util", "share", "at the knee: fill work's FLOPs at the training's MFU, as a share of GPU time"),
    ("fill_deadline_met", "share", "at the knee: share of the decided fill jobs that met their deadline"),
    ("fill_goodput_jobs_per_s", "jobs/s", "at the knee: fill jobs finished by their deadline per second"),
    ("fill_goodput_tokens_per_s", "tokens/s", "at the knee: their tokens per second"),
))

CPU_PREFILL = CsvFile("cpu_prefill.csv", "`experiment run` with `+bubbletea` and `compute: torch`",
                      "one row per timed prefill pass: the prefill model fitted to this CPU", _cols(
    _RUN,
    ("model", "", "the inference model (`tiny-llama`: testbed/runtime/tiny_llama.py)"),
    ("tokens", "tokens", "new tokens in the pass"),
    ("cached", "tokens", "tokens already in the KV cache (a later chunk)"),
    ("measured_s", "s", "the pass's time on this CPU (best of 5, one thread)"),
    ("held_out_predicted_s", "s", "the roofline's prediction, fitted on every other pass"),
    ("rel_error", "share", "|held_out_predicted_s / measured_s - 1|"),
))

BUBBLES = CsvFile("bubbles.csv", "`testbed sim`", "one row per idle interval of a GPU group", _cols(
    _RUN, _SOURCE,
    ("gpu", "", "GPU group, `s<stage>r<replica>`"),
    ("dc", "", "its DC"),
    ("stage", "", "pipeline stage"),
    ("replica", "", "data-parallel replica"),
    ("iteration", "", "training iteration"),
    ("start_s", "s", "start of the bubble"),
    ("end_s", "s", "end of the bubble"),
    ("dur_s", "s", "its length"),
))

VALIDATION = CsvFile("validation.csv", "`testbed experiment run` (modeled compute)",
                     "the simulator's prediction vs the emulated measurement, per metric", _cols(
    _RUN,
    ("scheduler", "", "scheduler"),
    ("metric", "", "a summary.csv column (`iteration_s`, `gpu_util`, `bubble_frac`), or `iteration_s@K` "
                   "(iteration K's length) and `iteration_s@K-L` (iterations K to L, those the changes fall in) "
                   "on a WAN that changes; with BubbleTea `served_in_bubbles@same_requests` (the share served in "
                   "bubbles over the requests both engines were offered), `bubble_served_ratio@same_requests` "
                   "(sim 1; emu: the emulated run's bubble-served requests over the simulator's, of those requests), "
                   "`train_slowdown` (emu: measured inside the run) and `train_slowdown_vs_alone` (emu: against "
                   "the separate run without BubbleTea), each beside the simulator's train_slowdown"),
    ("sim", "", "the simulator's value (the metric's unit)"),
    ("emu", "", "the emulated value (the metric's unit)"),
    ("rel_error", "share", "(sim - emu) / emu; empty for the slowdowns (near 0 it means nothing: read sim - emu)"),
    ("degraded", "", "as in summary.csv"),
))

LOSS = CsvFile("loss.csv", "`testbed experiment run` with `emulation.compute: torch`", "training loss", _cols(
    _RUN,
    ("scheduler", "", "scheduler"),
    ("iteration", "", "iteration"),
    ("loss", "", "mean cross-entropy of the last stage's microbatches"),
))

FLOWS = CsvFile("flows.csv", "`testbed experiment run` (every run whose pipes cross the WAN)",
                "HTB class byte counters per replica and WAN direction, sampled every 20 ms", _cols(
    _RUN,
    ("scheduler", "", "scheduler"),
    ("link", "", "WAN link, `<dc>-<dc>`"),
    ("towards", "", "the direction: traffic towards this DC"),
    ("replica", "", "data-parallel replica"),
    ("iteration", "", "iteration sampled (the first steady one)"),
    ("t_s", "s", "sample time on the run's clock"),
    ("wire_bytes", "bytes", "bytes the class has sent so far (emulated, i.e. real-world / scale)"),
    ("scale", "", "emulation scale k (real-world rate = wire rate x k)"),
    ("link_gbps", "Gbit/s", "the link's real-world capacity (drawn as a line on the flow figure)"),
))

CAPTURE = CsvFile("flows.csv (capture)", "`experiment run --capture`, `testbed launch --capture`, "
                  "`topology capture`", "bytes per TCP flow per millisecond on each WAN direction, from packet "
                  "headers", _cols(
    ("run_id", "", "the run (`capture` for `topology capture`)"),
    ("link", "", "WAN link, `<dc>-<dc>`"),
    ("towards", "", "the direction: traffic towards this DC"),
    ("t_ms", "ms", "1 ms bin, from the first captured packet"),
    ("src", "", "source address"),
    ("sport", "", "source port"),
    ("dst", "", "destination address"),
    ("dport", "", "destination port"),
    ("src_dc", "", "DC of the source host"),
    ("dst_dc", "", "DC of the destination host"),
    ("replica", "", "pipeline replica of the flow (our workers) or host index (launched jobs), from its receiver"),
    ("rank", "", "worker `s<stage>r<replica>` or torch ranks (`2|3` for a shared host)"),
    ("bytes", "bytes", "emulated bytes on the wire in the bin, each packet spread over its serialisation time"),
    ("packets", "", "packets whose timestamp falls in the bin"),
    ("scale", "", "`testbed launch`: the WAN's scale k"),
    ("dilation", "x", "`testbed launch`: how many times longer a bulk transfer of real bytes over one connection "
     "takes on this emulated link than on the spec's"),
    ("window_distortion", "x", "`testbed launch`: one emulated connection's rate over the scaled real-world one's "
     "(1: faithful; above 1 where the 64 KiB window floor applies)"),
))

RANKS = CsvFile("ranks.csv", "`testbed launch`", "one row per launched rank", _cols(
    ("rank", "", "torch.distributed rank"),
    ("host", "", "emulated host, `<dc>-h<j>`"),
    ("dc", "", "its DC"),
    ("replica", "", "the host's index in its DC"),
    ("exit_code", "", "the rank's exit status"),
    ("wall_s", "s", "wall-clock time from start to exit"),
    ("stopped_by_launch", "", "1 if the launch stopped it because another rank failed"),
    ("scale", "", "the WAN's scale k (the rank's TESTBED_SCALE)"),
    ("wan_dilation_max", "x", "the largest factor by which a bulk transfer of real bytes over one connection takes "
     "longer on the emulated WAN than on the spec's (scale.csv has each link's)"),
))

SCALE = CsvFile("scale.csv", "`testbed launch`", "one row per WAN link: the spec's and the emulated rate and window, "
                "and what the scale k does to a job's transfers (docs/launch.md)", _cols(
    ("link", "", "`<dc>-<dc>`"),
    ("a", "", "its first DC"),
    ("b", "", "its second DC"),
    ("latency_ms", "ms", "one-way latency, the spec's and the emulated one"),
    ("scale", "", "the WAN's scale k"),
    ("spec_gbps", "Gbit/s", "the spec's capacity"),
    ("emulated_mbps", "Mbit/s", "the emulated capacity: spec / k"),
    ("spec_window_bytes", "bytes", "one connection's window in the spec"),
    ("emulated_window_bytes", "bytes", "one emulated connection's: window / k in whole segments, 64 KiB at least"),
    ("connections", "", "the launch's multi-TCP count (NCCL sockets; gloo uses 1)"),
    ("dilation_1", "x", "a bulk transfer of real bytes over 1 connection: emulated time / the spec's"),
    ("dilation_n", "x", "the same over `connections` connections"),
    ("window_distortion", "x", "one emulated connection's rate / the scaled real-world one's (1: faithful)"),
    ("k_faithful", "", "the largest k whose scaled window needs no 64 KiB floor"),
))

CHECK = CsvFile("check.csv", "`testbed launch --check`", "one row per WAN link direction: the job's captured "
                "transfers against the simulator's model of them on the emulated link (docs/launch.md)", _cols(
    ("link", "", "`<dc>-<dc>`"),
    ("towards", "", "the direction: traffic towards this DC"),
    ("transfers", "", "transfers of 256 KiB or more matched in the capture"),
    ("mbytes", "MB", "their bytes on the wire"),
    ("median_error", "share", "median of captured / modelled duration - 1: above 0 the emulated WAN was slower"),
    ("worst_error", "share", "the largest error in magnitude, signed"),
))

LINKS = CsvFile("links.csv", "`testbed topology check`, `topology up --check`, `experiment run --check`",
                "one row per WAN link: configured vs measured", _cols(
    ("link", "", "`<dc>-<dc>`"),
    ("configured_mbps", "Mbit/s", "emulated (scaled) capacity"),
    ("measured_mbps_1", "Mbit/s", "iperf3 throughput with one TCP connection"),
    ("measured_mbps_n", "Mbit/s", "iperf3 throughput with `streams` connections"),
    ("workers_mbps_1", "Mbit/s", "the workers' transport (window-clamped, corked) with one connection"),
    ("workers_mbps_n", "Mbit/s", "the workers' transport striped over `streams` connections"),
    ("streams", "", "connections of the n-stream measurement"),
    ("model_mbps_1", "Mbit/s", "the simulator's one-connection rate: min(capacity, window / RTT)"),
    ("model_mbps_n", "Mbit/s", "the simulator's rate over `streams` connections: min(capacity, n window / RTT)"),
    ("configured_rtt_ms", "ms", "twice the configured one-way latency"),
    ("rtt_min_ms", "ms", "ping RTT, minimum"),
    ("rtt_avg_ms", "ms", "ping RTT, mean"),
    ("rtt_p99_ms", "ms", "ping RTT, 99th percentile"),
    ("workers_rtt_ms_1", "ms", "TCP's smoothed RTT during the workers' one-connection measurement"),
    ("workers_rtt_ms_n", "ms", "TCP's smoothed RTT during the workers' `streams`-connection measurement"),
    ("delay_method", "", "`netem`, `nfqueue` (our delay line) or `none`"),
    ("scale", "", "emulation scale k"),
    ("window_kib", "KiB", "emulated TCP window cap per connection"),
))

PLAN = CsvFile("plan.csv", "`testbed plan`",
               "one row per layout searched (DC chain x tp x pp x microbatch size, with the largest dp that fits); "
               "simulated rows first (fastest first), then estimated ones (by estimate_s), then rejected ones. "
               "Formulas: docs/planner.md", _cols(
    ("sweep", "", "with `testbed plan --sweep` only: the sweep point, `key=value;...`"),
    ("family", "", "`pipeline`, `dp-wan`, `diloco` or `streaming-diloco` (docs/families.md)"),
    ("scheduler", "", "the scheduler that scored the layout (the pipeline family's: `--scheduler`)"),
    ("dcs", "", "the DC set, in topology order, `|`-separated: the \"one site or several?\" group"),
    ("order", "", "the DCs in pipeline order (`a > b`)"),
    ("stages", "", "pipeline stages per DC, in that order (`a:4 b:4`); empty when no dp fits"),
    ("replicas", "", "data-parallel families: whole replicas per DC (`a:12 b:12`, as `workload.replicas_per_dc` "
                     "pins them)"),
    ("layers", "", "transformer layers per stage, space-separated (balanced by GPU speed and memory)"),
    ("tp", "", "tensor-parallel degree"),
    ("pp", "", "pipeline stages"),
    ("dp", "", "data-parallel replicas: the largest dividing global_batch / microbatch whose stages fit"),
    ("microbatch", "sequences", "sequences per microbatch"),
    ("microbatches", "", "microbatches per replica per iteration: global_batch / (microbatch x dp)"),
    ("gpus", "GPUs", "GPUs used: tp x pp x dp"),
    ("idle_gpus", "GPUs", "free GPUs of the DC set this layout leaves unused"),
    ("mem_gb", "GB", "peak memory of the fullest GPU (weights, gradients, optimizer state, 1F1B activations; "
                     "before Atlas's extra warm-up microbatches)"),
    ("estimate_s", "s", "the planner's analytic iteration time that ranks layouts before the best `--top` of each DC "
                        "set are simulated: 1F1B fill and drain plus (microbatches - 1) x the steady-state period "
                        "(slowest stage, busiest WAN direction and pipe, in-flight slack across WAN hops), the "
                        "replica last in turn order's starvation, the DP all-reduce and AdamW tail; empty if rejected"),
    ("iteration_s", "s", "simulated iteration time (empty when not simulated)"),
    ("lower_bound_s", "s", "the best plan only: the same placement with an ideal WAN"),
    ("tokens_per_s", "tokens/s", "simulated training throughput: global_batch x seq_len / iteration_s"),
    ("tokens_per_s_per_gpu", "tokens/s", "tokens_per_s / gpus (GPUs used, not idle ones)"),
    ("token_efficiency", "", "the family's token efficiency (simulated rows; testbed/plan/efficiency.py)"),
    ("effective_tokens_per_s", "tokens/s", "tokens_per_s x token_efficiency: what the rows are ranked by"),
    ("status", "", "`best` (chosen), `best of its family and DC set`, `simulated`, `estimated`, or "
                   "`rejected: <why>`"),
))

BACKENDS = CsvFile("backends.csv", "`bench/backend_compare.py`", "one emulated experiment on several backends", _cols(
    ("scheduler", "", "scheduler"),
    ("metric", "", "a summary.csv column"),
    ("base_backend", "", "the reference backend (the first of `--backends`)"),
    ("base", "", "its value (the metric's unit)"),
    ("other_backend", "", "the compared backend"),
    ("other", "", "its value"),
    ("ratio", "", "other / base"),
))

CLAIMS = CsvFile("claims.csv", "`testbed claims`, `make claims`", "one row per claim card (experiments/claims)", _cols(
    ("claim", "", "the card's name"),
    ("source", "", "where the published number comes from"),
    ("published", "", "the published number, in the card's unit"),
    ("ours", "", "the simulator's number: the best point of the card's space (`aggregate: max`) or its first"),
    ("unit", "", "`x` (a ratio), `fraction` (0-1) or `relative` (a gain: 0.63 = +63 %)"),
    ("accept", "", "the range of `ours` the card accepts as reproducing the claim"),
    ("verdict", "", "`reproduced`, `not reproduced`, or `different regime` (the setting cannot be the source's)"),
    ("where", "", "the point of the space where `ours` was found"),
    ("baseline", "", "the scheduler `ours` is measured against at that point (`best`: the fastest baseline of any "
                     "family, per token of synchronous training)"),
    ("baseline_family", "", "the baseline's family: pipeline across DCs, DP across DCs, DiLoCo, Streaming DiLoCo"),
    ("points", "", "points simulated (and those left out because a plan does not fit)"),
    ("settings", "", "the card's settings and searched space"),
    ("assumptions", "", "what the card assumes where the source is silent"),
))

CLAIM_POINTS = CsvFile("claims_points.csv", "`testbed claims`", "one row per claim card and point of its space", _cols(
    ("claim", "", "the card's name"),
    ("point", "", "the point: `key=value;...` over the card's space"),
    ("value", "", "the card's metric at the point"),
    ("scheduler_s", "s", "the claimed scheduler's iteration time"),
    ("baseline", "", "the baseline at the point"),
    ("baseline_family", "", "its family"),
    ("baseline_s", "s", "the baseline's iteration time"),
    ("kept", "", "1 if the point meets the card's `where` conditions"),
))

_WAN_RUN = "`testbed sim`, `testbed experiment run` on a topology whose links change (docs/wan-change.md)"
ITERATIONS = CsvFile("iterations.csv", _WAN_RUN, "one row per iteration of a run", _cols(
    _RUN, _SOURCE,
    ("scheduler", "", "the run's scheduler"),
    ("iteration", "", "iteration index (0 first)"),
    ("start_s", "s", "the iteration's start on the timeline clock (iterations back to back)"),
    ("iteration_s", "s", "its length"),
    ("wan_stall_s", "s", "seconds of it during which some transfer waited on a link that was down"),
))

LINKCHANGES = CsvFile("linkchanges.csv", _WAN_RUN, "one row per link change (and each link's state at 0)", _cols(
    _RUN, _SOURCE,
    ("link", "", "`<dc>-<dc>` as the topology names it (both directions change)"),
    ("t_s", "s", "when the schedule has the change, on the timeline clock"),
    ("applied_s", "s", "when it took effect on the timeline clock (the simulator: t_s)"),
    ("gbps", "Gbit/s", "the link's real-world capacity from then on (when up)"),
    ("latency_ms", "ms", "its one-way latency from then on"),
    ("up", "", "1 if the link carries traffic, 0 while it is down"),
    ("apply_ms", "ms", "how long applying the change took on the emulated WAN (0 in the simulator)"),
))

LINKRATES = CsvFile("linkrates.csv", _WAN_RUN, "each link direction's throughput over the run", _cols(
    _RUN, _SOURCE,
    ("link", "", "`<from dc>><to dc>`: one direction"),
    ("t_s", "s", "from this time on (timeline clock): the simulator's exact steps, the emulator's 20 ms bins"),
    ("gbps", "Gbit/s", "real-world throughput (emulated bytes times the scale k)"),
))

FIDELITY = CsvFile("fidelity.csv", "`bench/fidelity.py`", "one row per random topology and scheduler, simulated and "
                   "emulated (docs/fidelity.md)", _cols(
    ("topology", "", "the topology's index in the seed's draw"),
    ("seed", "", "the random seed that drew it"),
    ("draw", "", "`users` (tp 1, 2 or 4, dp 1-8, 1-20 Gbit/s, default hosts or one per group), `wide` (the same at "
     "tp 1-2, dp 1-4) or `narrow` (the earlier rounds' tp 1, dp 1-3, 1-10 Gbit/s, one host per group)"),
    ("dcs", "", "DCs in the topology (every pair linked)"),
    ("latency_ms", "ms", "one-way latency of each link, `|`-separated, in the order of the DC pairs (0-1, 0-2, ...)"),
    ("wan_gbps", "Gbit/s", "capacity of each link, in the same order"),
    ("tcp_window_mb", "MiB", "the TCP window of every link (real-world)"),
    ("tp", "", "tensor-parallel GPUs per group (one emulated worker; its host's NIC stands for tp NICs)"),
    ("pp", "", "pipeline stages"),
    ("dp", "", "data-parallel replicas"),
    ("hosts", "", "`default`: the spec's emulated hosts per DC (groups share one); `per-group`: one per GPU group"),
    ("schedule", "", "`1f1b` or `gpipe`"),
    ("microbatches", "", "microbatches per replica per iteration"),
    ("mfu", "share", "the model's MFU, chosen so compute is comparable to the transfers"),
    ("scale", "", "emulation scale factor k"),
    ("scheduler", "", "scheduler"),
    ("sim_s", "s", "simulated iteration time"),
    ("emu_s", "s", "emulated iteration time (mean over the iterations after the first)"),
    ("emu_min_s", "s", "fastest of those emulated iterations"),
    ("emu_max_s", "s", "slowest of them"),
    ("error", "share", "(sim_s - emu_s) / emu_s: above 0 the simulator predicts a slower iteration"),
    ("steal_share", "share", "of the VM's CPU time its hypervisor took during the case's emulated runs (/proc/stat "
     "steal): a busy host slows an emulated run"),
    ("load", "", "CPU-bound processes run beside the case (`--load`)"),
    ("loadavg", "", "the machine's 1-minute load average as the case started (`uptime`): other work on a shared "
     "machine"),
    ("timing_error", "share", "the emulated run's timing error (summary.csv)"),
    ("flagged", "", "1 if the emulated run was marked degraded (over its timing budget, drops, a lost sidecar)"),
    ("degraded", "", "why, as in summary.csv"),
))

FILES: tuple[CsvFile, ...] = (SUMMARY, MULTITCP, TIMELINE, REQUESTS, KNEE, BUBBLES, VALIDATION, LOSS, FLOWS,
                              CAPTURE, CPU_PREFILL, LINKS, PLAN, RANKS, SCALE, CHECK, BACKENDS, CLAIMS, CLAIM_POINTS,
                              ITERATIONS, LINKCHANGES, LINKRATES, FIDELITY)
_BY_NAME = {c.name: c for f in FILES for c in f.columns}
_BY_NAME.update({c.name: c for c in SUMMARY.columns})  # summary.csv's meaning wins for shared names

# Units for names the registry does not know (another helper's new column, a sweep key), by suffix.
_SUFFIX_UNITS = (("_ms", "ms"), ("_s", "s"), ("_gbps", "Gbit/s"), ("_mbps", "Mbit/s"), ("_mb", "MiB"),
                 ("_kib", "KiB"), ("_bytes", "bytes"), ("_frac", "share"), ("_util", "share"))
_OTHER_UNITS = {"speedup": "x"}  # values figures compute (figures/sweep.py), not CSV columns


def column(name: str) -> Column | None:
    return _BY_NAME.get(name)


def unit(name: str) -> str:
    c = _BY_NAME.get(name)
    if c is not None:
        return c.unit
    if name in _OTHER_UNITS:
        return _OTHER_UNITS[name]
    leaf = name.rsplit(".", 1)[-1]
    return next((u for suf, u in _SUFFIX_UNITS if leaf.endswith(suf) or leaf == suf[1:]), "")


def words(name: str) -> str:
    """The name in words, without its unit (`iteration_s` -> `iteration time`)."""
    w = _LABELS.get(name)
    if w is None:
        leaf = name.rsplit(".", 1)[-1]
        w = leaf
        for suf, _u in _SUFFIX_UNITS:
            if leaf.endswith(suf):
                w = leaf[: -len(suf)]
                break
        w = w.replace("_", " ")
    return w


def label(name: str) -> str:
    """An axis label: the name in words, with its unit (`iteration_s` -> `iteration time (s)`)."""
    w = words(name)
    u = unit(name)
    return f"{w} ({u if u != 'share' else '%'})" if u and u not in ("GPUs",) else w


_LABELS = {
    "iteration_s": "iteration time", "tokens_per_s": "training throughput", "tokens_per_s_per_gpu":
    "training throughput per GPU", "gpu_util": "GPU utilization (training + prefill)", "train_util":
    "GPU utilization (training)", "prefill_util": "prefill share of GPU time", "bubble_frac": "idle share of GPU time",
    "lower_bound_s": "lower bound (ideal WAN)", "wan_min_s": "WAN minimum", "train_slowdown": "training slowdown",
    "ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "slo_attainment": "TTFT SLO attainment",
    "prefill_tokens_per_s": "prefill throughput", "served_in_bubbles": "requests served in bubbles",
    "request_rate": "offered request rate", "wan_latency_ms": "one-way WAN latency", "wan_gbps": "WAN capacity",
    "throughput_mbps": "throughput", "tcp_connections": "TCP connections per stage pair",
    "speedup": "Atlas's speedup: iteration time / Atlas's", "speedup_vs_best": "speedup over the best baseline",
    # sweep keys users write most
    "topology.links.*.latency_ms": "one-way WAN latency (every link)", "topology.links.*.gbps":
    "WAN capacity (every link)", "topology.tcp_window_mb": "TCP window cap", "bubbletea.rate_scale":
    "request rate (x the trace's)", "workload.microbatches": "microbatches",
}


def markdown() -> str:
    """The registry as Markdown: one table per CSV."""
    out = []
    for f in FILES:
        out.append(f"### `{f.name}`\n\nWritten by {f.written_by}: {f.about}.\n")
        out.append("| column | unit | meaning |\n|---|---|---|")
        for c in f.columns:
            u = "0-1 (tables print %)" if c.unit == "share" else c.unit
            out.append(f"| `{c.name}` | {u} | {c.meaning.replace('|', '&#124;')} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


BEGIN, END = "<!-- columns:begin (python -m testbed.columns --write docs/outputs.md) -->", "<!-- columns:end -->"


def rewrite(doc: str) -> str:
    """`doc` with the text between the BEGIN and END markers replaced by the current registry."""
    pat = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pat.search(doc):
        raise ValueError(f"no {BEGIN} ... {END} section")
    return pat.sub(lambda _m: f"{BEGIN}\n{markdown()}{END}", doc)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        p = Path(sys.argv[2])
        p.write_text(rewrite(p.read_text()))
    else:
        sys.stdout.write(markdown())
