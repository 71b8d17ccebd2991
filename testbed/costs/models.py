"""Model zoo: transformer shapes from the published configs, parameter and FLOP counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from testbed.errors import SpecError


class ModelShape(Protocol):
    """A model described by its shape (the spec's `workload.model` mapping, testbed/spec/workload.py CustomModel)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int | None
    ffn_hidden: int | None
    vocab: int
    seq_len: int
    gated_mlp: bool


@dataclass(frozen=True)
class ModelConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    gated_mlp: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_params(self) -> int:
        h, kv = self.hidden, self.kv_heads * self.head_dim
        attn = h * h + 2 * h * kv + h * h  # Q, K, V, O
        mlp = (3 if self.gated_mlp else 2) * h * self.ffn_hidden
        return attn + mlp + 2 * h  # + two norms

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def total_params(self) -> int:
        return self.layers * self.layer_params() + 2 * self.embedding_params()

    def layer_fwd_flops(self, tokens: int, seq: int) -> float:
        """Forward FLOPs of one layer for `tokens` tokens in sequences of length `seq`.

        Matmuls: 2 FLOPs per parameter per token. Attention scores and weighted sum: 2 * 2 * s * h
        per token (Megatron's 4bs^2h; causal masking is not exploited, as in Megatron's count).
        """
        matmul = 2.0 * tokens * (self.layer_params() - 2 * self.hidden)
        attn = 4.0 * tokens * seq * self.hidden
        return matmul + attn

    def logits_fwd_flops(self, tokens: int) -> float:
        return 2.0 * tokens * self.hidden * self.vocab


def _m(name, layers, hidden, heads, kv, ffn, vocab, seq, gated) -> ModelConfig:
    return ModelConfig(name, layers, hidden, heads, kv, ffn, vocab, seq, gated)


MODELS: dict[str, ModelConfig] = {
    m.name: m
    for m in [
        _m("gpt3-175b", 96, 12288, 96, 96, 4 * 12288, 50257, 2048, False),  # Brown et al. 2020
        _m("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, True),  # Llama 3 model card
        _m("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, True),
        _m("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, True),
        _m("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, True),  # Llama 2 paper
        _m("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, True),
        _m("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, True),
        _m("bloom-176b", 70, 14336, 112, 112, 4 * 14336, 250880, 2048, False),  # BLOOM paper
        _m("tiny", 4, 128, 4, 4, 512, 512, 64, False),  # for tests and CPU torch runs
        _m("tiny-llama", 2, 64, 2, 1, 176, 32000, 4096, True),  # real CPU prefill (testbed/runtime/tiny_llama.py)
    ]
}


def resolve_model(model: str | ModelShape, seq_len: int | None = None, field: str = "workload.model") -> ModelConfig:
    if not isinstance(model, str):
        cfg = ModelConfig(
            model.name,
            model.layers,
            model.hidden,
            model.heads,
            model.kv_heads or model.heads,
            model.ffn_hidden or 4 * model.hidden,
            model.vocab,
            model.seq_len,
            model.gated_mlp,
        )
    else:
        if model not in MODELS:
            raise SpecError(field, f"unknown model {model!r}", f"use one of {', '.join(MODELS)} or a custom mapping")
        cfg = MODELS[model]
    if seq_len:
        cfg = ModelConfig(**{**cfg.__dict__, "seq_len": seq_len})
    return cfg
