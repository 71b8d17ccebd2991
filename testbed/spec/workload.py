"""Workload spec: the model, batch and parallelism of one training job."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from testbed.spec.bounds import (
    DDP_BUCKET_PARAMS,
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
    VIRTUAL_STAGES,
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
    # zb: zero-bubble (the backward's weight gradient deferred into the bubbles; docs/schedules.md)
    schedule: Literal["1f1b", "gpipe", "zb"] = "1f1b"
    # Megatron's virtual pipeline stages: model chunks per stage, run in its interleaved 1F1B (1: plain 1F1B)
    virtual_stages: VIRTUAL_STAGES = 1
    # `auto` (default): each layer's time from its operators at their shapes on the GPU (testbed/costs/operators.py),
    # the MFU then derived and reported in summary.csv; or a typed fraction of peak for every layer (an override)
    mfu: MFU | Literal["auto"] = "auto"
    recompute: Literal["none", "selective", "full"] = "selective"
    distributed_optimizer: bool = True
    # parameters per gradient bucket of the overlapped reduce-scatter (the `overlap` mechanism); unset:
    # Megatron-Core's default, max(40M, 1M x dp) (DistributedDataParallelConfig.bucket_size)
    ddp_bucket_params: DDP_BUCKET_PARAMS | None = None
    # Megatron sequence parallelism: the norms and dropouts outside the TP-sharded matmuls are split
    # along the sequence too, so their activations shrink by tp (same communication bytes); unset: on
    # whenever tp > 1, as Megatron-LM recommends
    sequence_parallel: bool | None = None
    # layers per stage: `auto` balances them by each stage's GPU speed and free memory (kept even when
    # that is as fast), `even` splits them as evenly as possible whatever the GPUs
    layer_split: Literal["auto", "even"] = "auto"
    # pins the pipeline's DCs, in order, with their number of stages (as `testbed plan` prints them);
    # pipeline placements only: dp-wan keeps whole pipelines inside each DC
    stages_per_dc: dict[str, PP] | None = None
    # pins the DCs of a data-parallel family (dp-wan, diloco, streaming-diloco) with their number of whole
    # replicas each, summing to dp (as `testbed plan` prints them); unset: the largest DCs filled first
    replicas_per_dc: dict[str, DP] | None = None
    # how the global batch is shared by the data-parallel replicas: `even` (equal shares; dp must divide the
    # batch's microbatches) or `speed` (data-parallel families: shares by each replica's speed, as Sailor splits
    # it; testbed/plan/batch_split.py)
    batch_split: Literal["even", "speed"] = "even"
    # hybrids: group name -> its DCs in pipeline order; the data-parallel families then run a pipeline over each
    # group's DCs and data parallelism or DiLoCo across the groups (testbed/plan/groups.py)
    groups: dict[LABEL, list[LABEL]] | None = None
    diloco: DiLoCo = DiLoCo()
    # tokens to a loss under synchronous training / tokens under this scheduler's (1: as good); None: the
    # family's default from published results (testbed/plan/efficiency.py)
    token_efficiency: EFFICIENCY | None = None

    def sequence_parallel_at(self, tp: int | None = None) -> bool:
        """Whether sequence parallelism is on at this tp (default: the workload's): as set, else when tp > 1."""
        if self.sequence_parallel is not None:
            return self.sequence_parallel
        return (self.tp if tp is None else tp) > 1

    @model_validator(mode="after")
    def _batch(self) -> Workload:
        """Batch arithmetic that needs no topology, each error naming the field to change."""
        if self.global_batch % self.microbatch:
            raise ValueError(f"global_batch: {self.global_batch} is not a multiple of microbatch={self.microbatch}; "
                             f"make global_batch a multiple of microbatch")
        seqs = self.global_batch // self.microbatch
        if self.dp != "auto" and self.batch_split == "speed" and self.dp > seqs:
            raise ValueError(f"dp: {self.dp} replicas for {seqs} microbatches per iteration (global_batch/microbatch); "
                             f"each replica needs one: lower dp or raise global_batch")
        if self.dp != "auto" and self.batch_split == "even" and seqs % self.dp:
            unequal = (" (every replica takes an equal share; set batch_split: speed to share the batch by each "
                       "site's speed, as Sailor does)" if self.replicas_per_dc else "")
            raise ValueError(f"dp: dp={self.dp} does not divide the {seqs} microbatches per iteration "
                             f"(global_batch/microbatch){unequal}; pick a dp dividing {seqs}, or dp: auto")
        if self.virtual_stages > 1 and self.schedule != "1f1b":
            raise ValueError(f"virtual_stages: {self.virtual_stages} model chunks per stage need schedule: 1f1b "
                             f"(Megatron's interleaved 1F1B); set schedule: 1f1b or virtual_stages: 1")
        if self.virtual_stages > 1 and self.pp < 2:
            raise ValueError(f"virtual_stages: {self.virtual_stages} model chunks per stage need pp >= 2; "
                             f"raise pp or set virtual_stages: 1")
        return self
