"""Which prefill model times a prefill pass: `ops` (default) or `curve` (`bubbletea.prefill_model`).

- `ops` (`costs/prefill_ops.py`): the training's operators at the pass's shape (GEMMs, causal attention,
  memory-bound operators, the KV cache write, the all-reduces) with four serving-stack constants per
  measured GPU. It covers every GPU the operator model knows (datasheet and ComputeSpec: the zoo and a
  user's own); one without measured rows borrows a measured GPU's stack constants (`prefill_ops.coverage`).
- `curve` (`costs/prefill.py`): a per-GPU roofline fitted on the same measurements; A100 and H100 (the
  H200 borrows the H100's), no other GPU.

Both are fitted on Splitwise's measured prompt times; `bench/prefill_model_error.py` scores them held out.
Standard library only: the emulated BubbleTea service times its jobs with it.
"""

from __future__ import annotations

from testbed.costs import prefill, prefill_ops
from testbed.costs.models import ModelConfig
from testbed.errors import SpecError

PREFILL_MODELS = ("ops", "curve")
DEFAULT_PREFILL_MODEL = "ops"


def _check(kind: str) -> None:
    if kind not in PREFILL_MODELS:
        raise SpecError("bubbletea.prefill_model", f"unknown prefill model {kind!r}", "use ops or curve")


def prefill_time_s(model: ModelConfig, gpu: str, tp: int, tokens: int, batch: int = 1,
                   kind: str = DEFAULT_PREFILL_MODEL) -> float:
    """One prefill pass of `batch` prompts of `tokens` tokens on each GPU of a TP group of `gpu`s."""
    _check(kind)
    if kind == "curve":
        return prefill.prefill_time_s(model, gpu, tp, tokens, batch)
    return prefill_ops.prefill_time_s(model, gpu, tp, tokens, batch)


def chunk_time_s(model: ModelConfig, gpu: str, tp: int, done: int, chunk: int,
                 kind: str = DEFAULT_PREFILL_MODEL) -> float:
    """Prefill of tokens [done, done+chunk) of one prompt after `done` are in the KV cache."""
    _check(kind)
    if kind == "curve":
        return prefill.chunk_time_s(model, gpu, tp, done, chunk)
    return prefill_ops.chunk_time_s(model, gpu, tp, done, chunk)


def coverage(gpu: str, kind: str = DEFAULT_PREFILL_MODEL) -> tuple[str, bool]:
    """The measured GPU whose constants `gpu` uses, and whether they are its own (False: borrowed)."""
    _check(kind)
    return prefill.coverage(gpu) if kind == "curve" else prefill_ops.coverage(gpu)
