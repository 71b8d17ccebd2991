"""Workload spec: the model, batch and parallelism of one training job."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from testbed.spec.topology import Strict


class CustomModel(Strict):
    name: str = "custom"
    layers: Annotated[int, Field(gt=0)]
    hidden: Annotated[int, Field(gt=0)]
    heads: Annotated[int, Field(gt=0)]
    kv_heads: Annotated[int, Field(gt=0)] | None = None
    ffn_hidden: Annotated[int, Field(gt=0)] | None = None
    vocab: Annotated[int, Field(gt=0)] = 32000
    seq_len: Annotated[int, Field(gt=0)] = 2048
    gated_mlp: bool = False

    @model_validator(mode="after")
    def _heads(self) -> CustomModel:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}; pick heads dividing hidden")
        return self


class Workload(Strict):
    model: str | CustomModel = "gpt3-175b"
    seq_len: Annotated[int, Field(gt=0)] | None = None  # overrides the model's default context
    global_batch: Annotated[int, Field(gt=0)] = 1728
    microbatch: Annotated[int, Field(gt=0)] = 1
    tp: Annotated[int, Field(gt=0)] = 8
    pp: Annotated[int, Field(gt=0)] = 12
    dp: Annotated[int, Field(gt=0)] | Literal["auto"] = "auto"
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    mfu: Annotated[float, Field(gt=0, le=1)] = 0.5
    recompute: Literal["none", "selective", "full"] = "selective"
    distributed_optimizer: bool = True
