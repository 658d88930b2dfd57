"""A draft model's memory beside its target (speculative decoding).

The runner (runner/draft_model.py) loads the draft's weights whole on the
target's main GPU when the target has any layer on a GPU, else on the CPU,
and gives it one context shaped as the target's: the same cells, sequence
ids, batch, KV cache type and flash attention, unified. So its memory is the
draft's own estimate with the target's options, every layer in one place:
on a GPU, its blocks and output layer there (the token embeddings stay on
the CPU, as llama.cpp keeps them) with the GPU's compute buffer, and the
host's buffer on the CPU; on the CPU, the whole of it. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jupyter_llm.memory.estimate import Estimate


@dataclass(frozen=True)
class DraftMemory:
    kv: int  # its KV cache, wherever its layers are
    cpu_weights: int  # everything on the CPU
    cpu_graph: int
    gpu_weights: int  # offloaded: on the target's first GPU
    gpu_graph: int
    host_weights: int  # offloaded: what stays on the CPU (token embeddings)
    host_graph: int

    @property
    def cpu_total(self) -> int:
        return self.cpu_weights + self.kv + self.cpu_graph

    @property
    def gpu_total(self) -> int:
        """On the GPU that holds it (its host part is on the CPU)."""
        return self.gpu_weights + self.kv + self.gpu_graph

    @property
    def host_total(self) -> int:
        return self.host_weights + self.host_graph


def draft_memory(est: Estimate) -> DraftMemory:
    """The draft's memory from its own estimate at the target's options."""
    output_gpu = 0 if est.output_on_cpu else est.output_weights
    # a tied output matrix left on the CPU is the token embeddings themselves
    tied_on_cpu = est.tied_output if est.output_on_cpu else 0
    return DraftMemory(
        kv=est.kv_total,
        cpu_weights=est.weights_total,
        cpu_graph=est.graph_full,
        gpu_weights=sum(est.layer_weights) + output_gpu,
        gpu_graph=est.gpu_graph_full,
        host_weights=est.input_weights + est.output_weights - output_gpu - tied_on_cpu,
        host_graph=est.host_graph_full,
    )
