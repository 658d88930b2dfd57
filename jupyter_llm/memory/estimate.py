"""How much memory a model needs with given options (Ollama's llm/memory.go model).

Everything is bytes; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from jupyter_llm.memory.model_info import ModelInfo
from jupyter_llm.memory.projector import ProjectorInfo, projector_graph

KV_PAD = 256  # llama.cpp allocates the KV cache in multiples of this many cells
KV_BYTES = {"f16": 2.0, "q8_0": 1.0, "q4_0": 0.5, "f32": 4.0}


@dataclass(frozen=True)
class EstimateOptions:
    num_ctx: int = 4096  # KV cells, shared by all of a runner's sequences
    num_batch: int = 512
    kv_type: str = "f16"


@dataclass(frozen=True)
class Estimate:
    layer_weights: tuple[int, ...]
    layer_kv: tuple[int, ...]
    output_weights: int
    input_weights: int
    graph_full: int  # compute graph when every layer is on one device
    graph_partial: int  # per device when the model is split
    # a vision projector: its weights and compute buffer, on one device
    projector_weights: int = 0
    projector_graph: int = 0

    @property
    def projector_total(self) -> int:
        return self.projector_weights + self.projector_graph

    @property
    def n_layer(self) -> int:
        return len(self.layer_weights)

    def layer_size(self, i: int) -> int:
        """Bytes of llama.cpp "layer" i; index n_layer is the output layer."""
        if i == self.n_layer:
            return self.output_weights
        return self.layer_weights[i] + self.layer_kv[i]

    @property
    def kv_total(self) -> int:
        return sum(self.layer_kv)

    @property
    def weights_total(self) -> int:
        return sum(self.layer_weights) + self.output_weights + self.input_weights

    @property
    def cpu_only_total(self) -> int:
        return self.weights_total + self.kv_total + self.graph_full + self.projector_total


def estimate(
    model: ModelInfo, opts: EstimateOptions, projector: ProjectorInfo | None = None
) -> Estimate:
    if opts.kv_type not in KV_BYTES:
        raise ValueError(f"unknown kv cache type {opts.kv_type!r}")
    # one unified KV cache, whatever the number of sequences, of num_ctx cells
    # rounded up as llama.cpp does
    context = -(-opts.num_ctx // KV_PAD) * KV_PAD
    kv_layer = int(
        context * (model.head_dim_k + model.head_dim_v) * model.n_head_kv * KV_BYTES[opts.kv_type]
    )
    batch = min(opts.num_batch, context)
    embd, heads, vocab = model.n_embd, model.n_head, model.n_vocab
    head_dim, heads_kv = model.head_dim_k, model.n_head_kv
    graph_full = max(
        4 * batch * (1 + 4 * embd + context * (1 + heads)),
        4 * batch * (embd + vocab),
    )
    graph_partial = 4 * batch * embd + max(
        4 * batch * (1 + embd + max(context, embd))
        + embd * embd * 9 // 16
        + 4 * context * (batch * heads + head_dim * heads_kv),
        4 * batch * (embd + vocab) + embd * vocab * 105 // 128,
    )
    return Estimate(
        layer_weights=model.layer_bytes,
        layer_kv=(kv_layer,) * model.n_layer,
        output_weights=model.output_bytes,
        input_weights=model.input_bytes,
        graph_full=graph_full,
        graph_partial=graph_partial,
        projector_weights=projector.weights_bytes if projector else 0,
        projector_graph=projector_graph(projector) if projector else 0,
    )
