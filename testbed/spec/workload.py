"""Workload spec: the model, batch and parallelism of one training job."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from testbed.spec.bounds import (
    DP,
    EFFICIENCY,
    FRAGMENTS,
    HEADS,
    INNER_STEPS,
    LABEL,
    LAYERS,
    MFU,
    OUTER_BITS,
    OVERLAP_STEPS,
    PP,
    SEQ_LEN,
    SEQUENCES,
    TP,
    VOCAB,
    WIDTH,
)
from testbed.spec.topology import Strict


class CustomModel(Strict):
    name: LABEL = "custom"
    layers: LAYERS
    hidden: WIDTH
    heads: HEADS
    kv_heads: HEADS | None = None
    ffn_hidden: WIDTH | None = None
    vocab: VOCAB = 32000
    seq_len: SEQ_LEN = 2048
    gated_mlp: bool = False

    @model_validator(mode="after")
    def _heads(self) -> CustomModel:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; pick heads dividing hidden")
        return self


class DiLoCo(Strict):
    """Low-communication training (schedulers `diloco`, `streaming-diloco`); a field left out takes the
    scheduler's published default (testbed/plan/diloco.py, docs/families.md)."""

    inner_steps: INNER_STEPS | None = None  # H: inner steps between two syncs of a fragment
    fragments: FRAGMENTS | None = None  # F: fragments synced in turn (DiLoCo: 1, the whole model)
    outer_bits: OUTER_BITS | None = None  # bits per outer-gradient value on the WAN
    overlap_steps: OVERLAP_STEPS | None = None  # tau: inner steps a fragment's sync overlaps (DiLoCo: 0)


class Workload(Strict):
    model: str | CustomModel = "gpt3-175b"
    seq_len: SEQ_LEN | None = None  # overrides the model's default context
    global_batch: SEQUENCES = 1728
    microbatch: SEQUENCES = 1
    tp: TP = 8
    pp: PP = 12
    dp: DP | Literal["auto"] = "auto"
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    mfu: MFU = 0.5
    recompute: Literal["none", "selective", "full"] = "selective"
    distributed_optimizer: bool = True
    # Megatron sequence parallelism: the norms and dropouts outside the TP-sharded matmuls are split
    # along the sequence too, so their activations shrink by tp (same communication bytes)
    sequence_parallel: bool = False
    # layers per stage: `auto` balances them by each stage's GPU speed and free memory (kept even when
    # that is as fast), `even` splits them as evenly as possible whatever the GPUs
    layer_split: Literal["auto", "even"] = "auto"
    # pins the pipeline's DCs, in order, with their number of stages (as `testbed plan` prints them);
    # pipeline placements only: dp-wan keeps whole pipelines inside each DC
    stages_per_dc: dict[str, PP] | None = None
    diloco: DiLoCo = DiLoCo()
    # tokens to a loss under synchronous training / tokens under this scheduler's (1: as good); None: the
    # family's default from published results (testbed/plan/efficiency.py)
    token_efficiency: EFFICIENCY | None = None

    @model_validator(mode="after")
    def _batch(self) -> Workload:
        """Batch arithmetic that needs no topology, each error naming the field to change."""
        if self.global_batch % self.microbatch:
            raise ValueError(f"global_batch: {self.global_batch} is not a multiple of microbatch={self.microbatch}; "
                             f"make global_batch a multiple of microbatch")
        seqs = self.global_batch // self.microbatch
        if self.dp != "auto" and seqs % self.dp:
            raise ValueError(f"dp: dp={self.dp} does not divide the {seqs} microbatches per iteration "
                             f"(global_batch/microbatch); pick a dp dividing {seqs}, or dp: auto")
        return self
