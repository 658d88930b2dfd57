"""How much memory a model needs with given options (Ollama's llm/memory.go model).

Everything is bytes; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jupyter_llm.memory.draft import DraftMemory, draft_memory
from jupyter_llm.memory.model_info import ModelInfo
from jupyter_llm.memory.outputs import draft_rows, output_rows
from jupyter_llm.memory.projector import ProjectorInfo, projector_graph
from jupyter_llm.request.priority import seq_ids  # paused batch sequences' ids count

KV_PAD = 256  # llama.cpp allocates the KV cache in multiples of this many cells
# bytes per value of each KV cache type: ggml's block size over its values per block
KV_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}

# llama.cpp's sliding-window pattern per architecture (llama.cpp src/models/*.cpp
# load_swa_pattern): every n-th layer is global, the others windowed; dense_first
# puts the global layer first in each group.
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "cohere2": (4, False),
    "cohere2moe": (4, True),
    "gpt-oss": (2, False),
    "llama4": (4, False),
}


def swa_layers(arch: str, n_layer: int, n_swa: int, pattern: int | None = None) -> tuple[bool, ...]:
    """Which layers llama.cpp windows (True), as llama_hparams::set_swa_pattern does."""
    if n_swa <= 0 or arch not in SWA_PATTERNS:
        return (False,) * n_layer
    n, dense_first = SWA_PATTERNS[arch]
    if pattern is not None:
        n = pattern
    if dense_first:
        return tuple(n == 0 or i % n != 0 for i in range(n_layer))
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


def swa_cells(context: int, n_swa: int, n_seq: int, n_ubatch: int, unified: bool = True) -> int:
    """Cells of the iswa cache's windowed part (llama_kv_cache_iswa, swa_full off)."""
    window = n_swa * (n_seq if unified else 1) + n_ubatch
    return -(-min(context, window) // KV_PAD) * KV_PAD


@dataclass(frozen=True)
class EstimateOptions:
    num_ctx: int = 4096  # KV cells, shared by all of a runner's sequences
    num_batch: int = 512
    kv_type: str = "f16"
    kv_type_k: str = ""  # the keys' type where it is not kv_type (memory.kv_cache.key_type)
    num_parallel: int = 4  # sequences sharing the unified cache
    swa_full: bool = False
    # the largest tensor the GPUs' backend takes (ggml-vulkan: the device's
    # storage buffer range); 0: no limit, as CUDA. See output_placement.
    gpu_max_tensor: int = 0
    # a draft model's context (memory.draft), whose decodes ask for a logit
    # row per sequence id at most, not the batch loop's (memory.outputs)
    draft_context: bool = False


@dataclass(frozen=True)
class Estimate:
    layer_weights: tuple[int, ...]
    layer_kv: tuple[int, ...]
    output_weights: int
    input_weights: int
    graph_full: int  # compute graph when every layer is on the CPU
    graph_partial: int  # the CPU's, ggml's own CPU backend beside no GPU (Ollama's split figure)
    tied_output: int = 0  # of output_weights, the token_embd shared with the input on the CPU
    # a vision projector: its weights and compute buffer, on one device
    projector_weights: int = 0
    projector_graph: int = 0
    # ggml's scheduler beside a GPU backend (measured on ggml-vulkan): see gpu_graphs
    gpu_graph_full: int = 0  # a GPU holding every layer
    gpu_graph_partial: int = 0  # a GPU when some layers are elsewhere
    host_graph_full: int = 0  # the CPU when every layer is on GPUs
    host_graph_partial: int = 0  # the CPU when it holds layers beside a GPU
    # the output matrix stays on the CPU even when its layer is offloaded
    output_on_cpu: bool = False
    # a draft model: whole on the first GPU with layers (its host part on the
    # CPU), or whole on the CPU
    draft: DraftMemory | None = None

    @property
    def projector_total(self) -> int:
        return self.projector_weights + self.projector_graph

    @property
    def n_layer(self) -> int:
        return len(self.layer_weights)

    def layer_size(self, i: int) -> int:
        """Bytes of llama.cpp "layer" i on a GPU; index n_layer is the output layer."""
        if i == self.n_layer:
            return 0 if self.output_on_cpu else self.output_weights
        return self.layer_weights[i] + self.layer_kv[i]

    @property
    def kv_total(self) -> int:
        return sum(self.layer_kv)

    @property
    def weights_total(self) -> int:
        # a tied output on the CPU is the input tensor itself; offloaded, it is duplicated
        return sum(self.layer_weights) + self.output_weights + self.input_weights - self.tied_output

    @property
    def draft_gpu(self) -> int:
        """What the draft adds to the first GPU with layers."""
        return self.draft.gpu_total if self.draft else 0

    @property
    def cpu_only_total(self) -> int:
        draft = self.draft.cpu_total if self.draft else 0
        return self.weights_total + self.kv_total + self.graph_full + self.projector_total + draft


def estimate(
    model: ModelInfo,
    opts: EstimateOptions,
    projector: ProjectorInfo | None = None,
    draft: ModelInfo | None = None,
) -> Estimate:
    """``model``'s memory with ``opts``; with a ``projector``, and a ``draft``
    model, whose context has the same options (memory.draft)."""
    type_k = opts.kv_type_k or opts.kv_type
    for kv_type in (opts.kv_type, type_k):
        if kv_type not in KV_BYTES:
            raise ValueError(f"unknown kv cache type {kv_type!r}")
    # one unified KV cache, whatever the number of sequences, of num_ctx cells
    # rounded up as llama.cpp does
    context = -(-opts.num_ctx // KV_PAD) * KV_PAD
    batch = min(opts.num_batch, context)
    key_cell = model.n_head_kv * model.head_dim_k * KV_BYTES[type_k]  # one layer's K, a cell
    value_cell = model.n_head_kv * model.head_dim_v * KV_BYTES[opts.kv_type]
    per_cell = key_cell + value_cell
    windowed = swa_layers(model.architecture, model.n_layer, model.n_swa, model.swa_pattern)
    ids = seq_ids(opts.num_parallel)
    cells_swa = context if opts.swa_full else swa_cells(context, model.n_swa, ids, batch)
    swa_mask = cells_swa if any(windowed) else 0  # the windowed cache's mask, where there is one
    layer_kv = tuple(int((cells_swa if w else context) * per_cell) for w in windowed)
    embd, heads, vocab = model.n_embd, model.n_head, model.n_vocab
    head_dim, heads_kv = model.head_dim_k, model.n_head_kv
    # the runner runs flash attention (llama.cpp's auto): the graph's peak is
    # either a block's (its f16 mask over every cell, the residual stream and
    # the feed-forward activations) or the output's (the logits of the rows a
    # step samples, memory.outputs: the last block runs on those rows only)
    n_ff = model.n_ff or 4 * embd
    rows = draft_rows(ids) if opts.draft_context else output_rows(batch, opts.num_parallel, ids)
    output_buffer = 4 * vocab * rows  # the logits copied out, at their most rows
    out = min(rows, batch)  # the graph is reserved for a batch's rows at most
    masks = 2 * batch * (context + swa_mask)  # f16, one per cache
    graph_full = output_buffer + max(
        masks + 4 * batch * (4 * embd + 3 * n_ff),
        4 * out * (vocab + n_ff + 2 * embd),
    )
    graph_partial = (
        output_buffer
        + 4 * batch * embd
        + max(
            4 * batch * (1 + embd + max(context, embd))
            + embd * embd * 9 // 16
            + 4 * context * (batch * heads + head_dim * heads_kv),
            4 * out * (embd + vocab) + embd * vocab * 105 // 128,
        )
    )
    gpu = gpu_graphs(
        model,
        context,
        batch,
        swa_mask,
        opts.gpu_max_tensor,
        rows,
        cache_cell=(key_cell, value_cell),
    )
    return Estimate(
        layer_weights=model.layer_bytes,
        layer_kv=layer_kv,
        output_weights=model.output_bytes,
        input_weights=model.input_bytes,
        graph_full=graph_full,
        graph_partial=graph_partial,
        tied_output=model.input_bytes if model.tied_embeddings else 0,
        projector_weights=projector.weights_bytes if projector else 0,
        projector_graph=projector_graph(projector) if projector else 0,
        gpu_graph_full=gpu.device_full,
        gpu_graph_partial=gpu.device_partial,
        host_graph_full=gpu.host_full,
        host_graph_partial=gpu.host_partial,
        output_on_cpu=not output_placement(model, rows, opts.gpu_max_tensor).weights_on_gpu,
        # the draft's context has the model's options but never batch-invariant keys
        draft=draft_memory(estimate(draft, replace(opts, kv_type_k="", draft_context=True)))
        if draft
        else None,
    )


# llama.cpp keeps a weight on a device only where the device runs its product
# with 512 tokens (llama-model-loader.cpp weight_buft_supported)
PROBE_TOKENS = 512


@dataclass(frozen=True)
class OutputPlacement:
    weights_on_gpu: bool  # the output matrix in an offloaded output layer's GPU
    logits_on_gpu: bool  # the GPU runs the output product (its weights copied there if need be)


def output_placement(model: ModelInfo, rows: int, max_tensor: int) -> OutputPlacement:
    """Where the output layer lands beside a GPU backend that takes no tensor
    over ``max_tensor`` bytes (ggml-vulkan's supports_op: an operation with a
    bigger source or result runs on the CPU). Measured on lavapipe: Gemma 3's
    170 MiB output matrix stays on the CPU with its logits; a 70k vocabulary
    of 256 keeps its 69 MiB matrix on the CPU (512 tokens' logits are 137
    MiB), and a batch of 256 runs on the GPU with that matrix copied over.
    ``rows``: the logit rows of a step (memory.outputs)."""
    if not max_tensor:
        return OutputPlacement(True, True)
    matrix = model.output_bytes
    logits = 4 * model.n_vocab
    return OutputPlacement(
        weights_on_gpu=max(matrix, logits * PROBE_TOKENS) <= max_tensor,
        logits_on_gpu=max(matrix, logits * rows) <= max_tensor,
    )


@dataclass(frozen=True)
class GpuGraphs:
    device_full: int
    device_partial: int
    host_full: int
    host_partial: int


def gpu_graphs(
    model: ModelInfo,
    context: int,
    batch: int,
    cells_swa: int,
    max_tensor: int,
    rows: int,
    cache_cell: tuple[float, float],
) -> GpuGraphs:
    """The compute buffers ggml's scheduler reserves with a GPU backend, for a
    batch of ``batch`` tokens (n_ubatch) over ``context`` cells, flash attention on.

    Measured on ggml-vulkan (lavapipe) over demo models and Gemma 3 270M
    (tests/memory/test_memory.py): the GPU's peak is a block's (its f16 masks, the
    residual stream and the feed-forward activations) or the output's (a
    batch's logits). Split, the GPU also runs the big matrix products of the
    CPU's layers (op offload, a batch of 32 or more), each weight copied into
    its compute buffer: the largest block weight more. The CPU's buffer holds
    the inputs (token embeddings, the masks) and, split, a K projection, plus
    the logits' output buffer, and the output's peak when the GPU cannot
    take the output product (output_placement). ``rows``: the logit rows of
    a step (memory.outputs), at least a row per sequence id.

    Split, the GPU runs the CPU layers' attention too (nothing ties it to
    the CPU: a cache is not a weight), so a CPU layer's K and V over every
    cell are copied into the GPU's buffer beside the masks (``GGML_SCHED_DEBUG``
    shows them as the splits' inputs): past about 4k cells that is the GPU's
    peak, growing with the context. ``cache_cell``: bytes of one layer's K
    and V per cell. Where the freed copies of one layer leave room for the
    next layer's depends on what ggml's allocator placed between them: on
    lavapipe a batch of 512 over 8k-32k cells took from none to one mask's
    worth more, counted here as half a mask or half a K copy, the smaller.
    """
    embd, n_ff, vocab = model.n_embd, model.n_ff or 4 * model.n_embd, model.n_vocab
    q_dim = model.n_head * model.head_dim_k
    kv_dim = model.n_head_kv * model.head_dim_k
    masks = 2 * batch * (context + cells_swa)  # f16, one per cache
    block = masks + 4 * batch * (embd + max(embd, q_dim) + 3 * n_ff)
    out = min(rows, batch)  # the graph is reserved for a batch's rows at most
    output = 4 * out * (vocab + 2 * embd)
    # the largest block weight: a feed-forward matrix's share of the block's parameters
    params = embd * (2 * q_dim + 2 * kv_dim) + 3 * embd * n_ff
    biggest = max(model.layer_bytes, default=0) * embd * n_ff // max(1, params)
    output_buffer = 4 * vocab * rows  # at its most rows (memory.outputs)
    inputs = masks + 8 * batch * embd
    placed = output_placement(model, out, max_tensor)
    if not placed.logits_on_gpu:
        # the output runs on the CPU, after the last block has used the masks
        inputs, output = max(inputs, output), 0
    elif not placed.weights_on_gpu:
        output += model.output_bytes  # its matrix copied to the GPU for each batch
    key_cell, value_cell = cache_cell
    mask_cell = 2 * batch
    copies = context * (key_cell + value_cell + min(mask_cell, key_cell) / 2)
    attention = masks + int(copies) + 4 * batch * (embd + 2 * q_dim)
    return GpuGraphs(
        device_full=max(block, output),
        device_partial=max(block + biggest, attention, output),
        host_full=inputs + output_buffer,
        host_partial=inputs + output_buffer + 4 * batch * kv_dim,
    )
