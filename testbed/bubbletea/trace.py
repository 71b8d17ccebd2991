"""Request traces: the Azure LLM inference trace format, any CSV of that shape, or a synthetic one.

Format (Splitwise / Azure 2023): `TIMESTAMP,ContextTokens,GeneratedTokens`, timestamps as
`YYYY-MM-DD HH:MM:SS.fffffff`, or plain seconds. Arrivals are made relative to the first request.

Synthetic defaults come from the Azure conversation trace (2023-11-16, 19,366 requests in 3,502 s):
Poisson arrivals at 5.53 requests/s (the trace's inter-arrival CV is 1.09, close to Poisson's 1);
prompt tokens lognormal with the trace's median (1,020) and p99 (4,142): mu = ln 1020 = 6.928,
sigma = (ln 4142 - ln 1020) / 2.326 = 0.602 (the real distribution is not lognormal: fitting the
log-mean would put the median at 760); output tokens lognormal with median 129 (mu 4.860) and the
trace's log-std 0.859. The code trace is burstier (CV 13) with longer prompts (median 1,469).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from testbed.errors import SpecError

CONV_RATE, CONV_PROMPT, CONV_OUTPUT = 5.53, (6.928, 0.602), (4.860, 0.859)
MAX_PROMPT = 32_768


@dataclass(frozen=True)
class Request:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


def _parse_time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    text = text.strip()
    if "." in text:  # the Azure files carry 7 fractional digits; datetime takes 6
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    return datetime.fromisoformat(text).timestamp()


def load_trace(path: str | Path, *, rate_scale: float = 1.0, start_s: float = 0.0,
               duration_s: float | None = None) -> list[Request]:
    """Load a trace; `rate_scale` > 1 compresses time (more requests per second); the window
    [start_s, start_s + duration_s) is taken after scaling. Bad rows fail with their line number."""
    path = Path(path)
    if not path.is_file():
        raise SpecError("bubbletea.trace", f"{path} not found",
                        "use `synthetic`, or download AzureLLMInferenceTrace_*.csv from Azure/AzurePublicDataset")
    try:
        return _read_trace(path, rate_scale, start_s, duration_s)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise SpecError("bubbletea.trace", f"{path} is not a readable CSV ({type(e).__name__})",
                        "use an Azure-format CSV, or `synthetic`") from None


def _read_trace(path: Path, rate_scale: float, start_s: float, duration_s: float | None) -> list[Request]:
    reqs: list[Request] = []
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        need = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if not need <= set(r.fieldnames or []):
            raise SpecError(str(path), f"expected columns {sorted(need)}, found {r.fieldnames}",
                            "use the Azure LLM inference trace format")
        t0 = None
        last = -math.inf
        for line, row in enumerate(r, start=2):
            try:
                t = _parse_time(row["TIMESTAMP"])
                p, o = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError):
                raise SpecError(f"{path}:{line}", "unreadable row", "fix TIMESTAMP, ContextTokens, GeneratedTokens"
                                ) from None
            if p <= 0 or o < 0:
                raise SpecError(f"{path}:{line}", f"ContextTokens={p}, GeneratedTokens={o}",
                                "prompt tokens must be positive and generated tokens non-negative")
            if t < last:
                raise SpecError(f"{path}:{line}", "timestamps go backwards", "sort the trace by TIMESTAMP")
            last = t
            t0 = t if t0 is None else t0
            arrival = (t - t0) / rate_scale
            if arrival < start_s:
                continue
            if duration_s is not None and arrival >= start_s + duration_s:
                break
            reqs.append(Request(len(reqs), arrival - start_s, p, o))
    return reqs


def synthetic_trace(duration_s: float, *, rate: float = CONV_RATE, rate_scale: float = 1.0, seed: int = 0,
                    prompt: tuple[float, float] = CONV_PROMPT, output: tuple[float, float] = CONV_OUTPUT
                    ) -> list[Request]:
    """Poisson arrivals, lognormal prompt and output lengths (defaults: the Azure conversation trace)."""
    rng = random.Random(seed)
    lam = rate * rate_scale
    out, t = [], rng.expovariate(lam)
    while t < duration_s:
        p = min(MAX_PROMPT, max(1, round(rng.lognormvariate(*prompt))))
        o = max(1, round(rng.lognormvariate(*output)))
        out.append(Request(len(out), t, p, o))
        t += rng.expovariate(lam)
    return out


def write_trace(path: str | Path, reqs: list[Request]) -> None:
    """Write in the Azure format (TIMESTAMP in seconds), so `load_trace` reads it back."""
    from testbed.results import write_csv

    write_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
              ((f"{r.arrival_s:.6f}", r.prompt_tokens, r.output_tokens) for r in reqs))
