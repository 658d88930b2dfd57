"""Tiny, valid GGUF models for tests, demos and benchmarks.

The weights are seeded random numbers: the model talks nonsense, but it
exercises every path (tokenizer, chat template, KV cache, sampling) through
llama.cpp exactly like a real model does, and nothing has to be downloaded.
Besides the default llama model there are the shapes of embedding models:
``qwen3`` (decoder, as qwen3-embedding) and ``bert`` (encoder), each with an
optional ``<arch>.pooling_type``, and a vision model: a text model with its
image projector (``write_vision_model``), which llama.cpp's mtmd loads.

    python -m jupyter_llm.demo model.gguf            # just the file
    python -m jupyter_llm.demo --install demo         # into the model store
    python -m jupyter_llm.demo --vision --install demo-vision  # with its projector
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

Weights = Callable[..., np.ndarray]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

BOS, EOS, IM_START, IM_END = "<s>", "</s>", "<|im_start|>", "<|im_end|>"
FIM_PRE, FIM_SUF, FIM_MID = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"
SPECIALS = (BOS, EOS, IM_START, IM_END, FIM_PRE, FIM_SUF, FIM_MID)


@dataclass(frozen=True)
class DemoModelSpec:
    """Shape of a generated model; defaults load in milliseconds."""

    n_embd: int = 64
    n_layer: int = 2
    n_ff: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    context_length: int = 2048
    seed: int = 0
    name: str = "jupyter-llm-demo"
    chat_template: str = CHAT_TEMPLATE  # tests give hostile ones
    arch: str = "llama"  # one of ARCHS
    # ``<arch>.pooling_type`` (0 none, 1 mean, 2 CLS, 3 last, 4 rank); None: no key
    pooling_type: int | None = None
    # scale of the attention weights: larger, earlier positions (an image) sway the output more
    attn_scale: float = 0.02
    # more tokens, user-defined as a real vocabulary's added tokens are
    # (``<tool_call>`` is one token in Qwen's): appended, so no id moves
    extra_tokens: tuple[str, ...] = ()
    # a token the model always likes best where it may write it (greedy
    # output is that token, over and over): its output row is aligned with
    # a direction every embedding shares. For tests of what a model chooses
    # to write, such as the lazy tool-call grammar's trigger. "": none
    favourite: str = ""
    # every byte about as likely as any other, ASCII or not: at temperature 1
    # the model writes random bytes, most of them not UTF-8 by themselves
    # (for tests of what a grammar lets through)
    uniform_bytes: bool = False
    # the fill-in-the-middle token ids (``insert`` in /api/show); False: a
    # model that cannot insert, as a chat-only GGUF
    fim: bool = True


ARCHS = ("llama", "qwen3", "bert")


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode mapping used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def vocabulary(extra: tuple[str, ...] = ()) -> tuple[list[str], list[int], list[str]]:
    """Byte tokens, a few merged tokens, the special tokens and the ``extra``
    (user-defined) ones, with their types."""
    import gguf

    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [gguf.TokenType.NORMAL] * 256
    merges = [f"{b2u[ord('h')]} {b2u[ord('e')]}", f"{b2u[ord(' ')]} {b2u[ord('t')]}"]
    tokens += ["he", b2u[ord(" ")] + "t"]
    types += [gguf.TokenType.NORMAL] * 2
    for special in SPECIALS:
        tokens.append(special)
        types.append(gguf.TokenType.CONTROL)
    for token in extra:
        if token in tokens:
            raise ValueError(f"{token!r} is already a token")
        tokens.append(token)
        types.append(gguf.TokenType.USER_DEFINED)
    return tokens, [int(t) for t in types], merges


def write_demo_model(path: str | os.PathLike[str], spec: DemoModelSpec | None = None) -> Path:
    """Write a GGUF with random f32 weights to ``path`` (atomically)."""
    import gguf

    spec = spec or DemoModelSpec()
    _check_spec(spec)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, types, merges = vocabulary(spec.extra_tokens)
    if spec.favourite and spec.favourite not in tokens:
        raise ValueError(f"favourite {spec.favourite!r} is not a token")
    n_vocab = len(tokens)
    rng = np.random.default_rng(spec.seed)

    def weights(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), spec.arch)
    _write_metadata(writer, spec, tokens, types, merges)

    if spec.arch == "bert":
        _bert_tensors(writer, spec, n_vocab, weights)
    else:
        _decoder_tensors(writer, spec, tokens, weights)

    _finish(writer, tmp, path)
    return path


def _check_spec(spec: DemoModelSpec) -> None:
    if spec.arch not in ARCHS:
        raise ValueError(f"arch must be one of {', '.join(ARCHS)}")
    if spec.n_embd % spec.n_head or spec.n_head % spec.n_head_kv:
        raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
    if spec.arch == "bert" and spec.n_head_kv != spec.n_head:
        raise ValueError("a bert model has n_head_kv == n_head")


def write_tokenizer(writer: Any, tokens: list[str], types: list[int], merges: list[str]) -> None:
    """The demo vocabulary's tokenizer keys (``vocabulary``): a byte-level BPE
    whose BOS is ``<s>`` and whose EOS ends a chat turn."""
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index(BOS))
    writer.add_eos_token_id(tokens.index(IM_END))


def _write_metadata(
    writer: Any, spec: DemoModelSpec, tokens: list[str], types: list[int], merges: list[str]
) -> None:
    """The hyperparameters, the tokenizer and the chat template."""
    import gguf

    writer.add_name(spec.name)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layer)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head_kv)
    if spec.arch == "bert":
        writer.add_layer_norm_eps(1e-12)
        writer.add_causal_attention(False)
        writer.add_token_type_count(2)
    else:
        writer.add_rope_dimension_count(spec.n_embd // spec.n_head)
        writer.add_layer_norm_rms_eps(1e-5)
    if spec.pooling_type is not None:
        writer.add_pooling_type(gguf.PoolingType(spec.pooling_type))
    write_tokenizer(writer, tokens, types, merges)
    # A bert model starts every input with its CLS token (here BOS).
    writer.add_add_bos_token(spec.arch == "bert")
    if spec.arch != "bert":
        writer.add_chat_template(spec.chat_template)
    if spec.arch != "bert" and spec.fim:
        for key, special in (("pre", FIM_PRE), ("suf", FIM_SUF), ("mid", FIM_MID)):
            writer.add_uint32(f"tokenizer.ggml.fim_{key}_token_id", tokens.index(special))


def _decoder_tensors(writer: Any, spec: DemoModelSpec, tokens: list[str], weights: Weights) -> None:
    """llama's tensors; qwen3 adds a norm of the queries and keys per head."""
    n_vocab = len(tokens)
    head_dim = spec.n_embd // spec.n_head
    n_embd_kv = head_dim * spec.n_head_kv
    embeddings = weights(n_vocab, spec.n_embd, scale=1.0)
    if spec.favourite:
        embeddings[:, 0] = 8.0  # the shared direction (see DemoModelSpec.favourite)
    writer.add_tensor("token_embd.weight", embeddings)
    for i in range(spec.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
        attn = spec.attn_scale
        writer.add_tensor(f"blk.{i}.attn_q.weight", weights(spec.n_embd, spec.n_embd, scale=attn))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weights(n_embd_kv, spec.n_embd, scale=attn))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weights(n_embd_kv, spec.n_embd, scale=attn))
        if spec.arch == "qwen3":
            writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        writer.add_tensor(
            f"blk.{i}.attn_output.weight", weights(spec.n_embd, spec.n_embd, scale=attn)
        )
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weights(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weights(spec.n_ff, spec.n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weights(spec.n_embd, spec.n_ff))
    writer.add_tensor("output_norm.weight", np.ones(spec.n_embd, dtype=np.float32))
    output = weights(n_vocab, spec.n_embd, scale=0.1 if spec.uniform_bytes else 1.0)
    # Only printable ASCII (and the merged tokens) get large logits, so the
    # nonsense is at least readable; the end-of-generation tokens stay unlikely
    # so that greedy decoding runs long.
    b2u = byte_to_unicode()
    for b in range(256):
        if not (32 <= b < 127 or b == 10 or spec.uniform_bytes):
            output[tokens.index(b2u[b])] = 0.0
    for special in (*SPECIALS, *spec.extra_tokens):
        output[tokens.index(special)] = 0.0
    if spec.favourite:
        output[tokens.index(spec.favourite)] = 0.0
        output[tokens.index(spec.favourite), 0] = 50.0
    writer.add_tensor("output.weight", output)


def _bert_tensors(writer: Any, spec: DemoModelSpec, n_vocab: int, weights: Weights) -> None:
    """An encoder: learned positions, token types, post-norm layers with biases."""
    n, ff = spec.n_embd, spec.n_ff

    def norm(name: str) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(n, dtype=np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(n, dtype=np.float32))

    def linear(name: str, n_out: int, n_in: int) -> None:
        writer.add_tensor(f"{name}.weight", weights(n_out, n_in, scale=0.1))
        writer.add_tensor(f"{name}.bias", weights(n_out))

    writer.add_tensor("token_embd.weight", weights(n_vocab, n, scale=1.0))
    writer.add_tensor("token_types.weight", weights(2, n))
    writer.add_tensor("position_embd.weight", weights(spec.context_length, n, scale=0.1))
    norm("token_embd_norm")
    for i in range(spec.n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            linear(f"blk.{i}.{part}", n, n)
        norm(f"blk.{i}.attn_output_norm")
        linear(f"blk.{i}.ffn_up", ff, n)
        linear(f"blk.{i}.ffn_down", n, ff)
        norm(f"blk.{i}.layer_output_norm")


@dataclass(frozen=True)
class VisionSpec:
    """Shape of a generated image encoder (a llava-style CLIP with an MLP
    projector): a ``image_size`` square image in ``patch_size`` patches, one
    embedding per patch, so an image is ``(image_size // patch_size) ** 2``
    positions of the text model (16 by default) and encodes in milliseconds."""

    image_size: int = 32
    patch_size: int = 8
    n_embd: int = 32
    n_ff: int = 64  # not n_embd: clip.cpp takes ffn_down of width n_embd as swapped
    n_head: int = 2
    n_layer: int = 2  # llava's graph runs all but the last layer
    seed: int = 1


def write_vision_model(
    directory: str | os.PathLike[str],
    name: str = "tiny-vision",
    spec: DemoModelSpec | None = None,
    vision: VisionSpec | None = None,
) -> tuple[Path, Path]:
    """Write ``<name>.gguf`` (a text model, ``spec``) and its random-weight
    image projector ``mmproj-<name>.gguf`` into ``directory``; returns both
    paths. The projector's output width is the text model's ``n_embd``, as
    mtmd requires."""
    directory = Path(directory)
    spec = spec or DemoModelSpec(name=name, attn_scale=0.15)  # the image sways the answer
    model = write_demo_model(directory / f"{name}.gguf", spec)
    projector = write_projector(directory / f"mmproj-{name}.gguf", spec.n_embd, vision)
    return model, projector


def write_projector(
    path: str | os.PathLike[str], n_embd_text: int, vision: VisionSpec | None = None
) -> Path:
    """An mmproj GGUF (``general.architecture = "clip"``, projector type
    ``mlp``, as llava 1.5's) with seeded random weights, written atomically."""
    import gguf

    v = vision or VisionSpec()
    if v.image_size % v.patch_size or v.n_embd % v.n_head or v.n_ff == v.n_embd:
        raise ValueError("image_size must divide by patch_size, n_embd by n_head; n_ff != n_embd")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(v.seed)

    def weights(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    n, n_pos = v.n_embd, (v.image_size // v.patch_size) ** 2
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), "clip")
    _write_projector_metadata(writer, v, n_embd_text)

    def linear(name: str, n_out: int, n_in: int) -> None:
        writer.add_tensor(f"{name}.weight", weights(n_out, n_in))
        writer.add_tensor(f"{name}.bias", weights(n_out, scale=0.02))

    def norm(name: str) -> None:
        writer.add_tensor(f"{name}.weight", np.ones(n, dtype=np.float32))
        writer.add_tensor(f"{name}.bias", np.zeros(n, dtype=np.float32))

    # numpy shapes are ggml's ne reversed: the patch convolution is [OC, IC, KH, KW]
    writer.add_tensor("v.patch_embd.weight", weights(n, 3, v.patch_size, v.patch_size))
    writer.add_tensor("v.patch_embd.bias", weights(n, scale=0.02))
    writer.add_tensor("v.position_embd.weight", weights(n_pos, n))
    norm("v.pre_ln")
    for i in range(v.n_layer):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            linear(f"v.blk.{i}.{part}", n, n)
        norm(f"v.blk.{i}.ln1")
        norm(f"v.blk.{i}.ln2")
        linear(f"v.blk.{i}.ffn_up", v.n_ff, n)
        linear(f"v.blk.{i}.ffn_down", n, v.n_ff)
    # the projector: two layers with a GELU between, out to the text model's width
    linear("mm.0", n_embd_text, n)
    writer.add_tensor("mm.2.weight", weights(n_embd_text, n_embd_text, scale=1.0))
    writer.add_tensor("mm.2.bias", weights(n_embd_text, scale=0.02))
    _finish(writer, tmp, path)
    return path


def _write_projector_metadata(writer: Any, v: VisionSpec, n_embd_text: int) -> None:
    import gguf

    writer.add_name("jupyter-llm-demo-vision")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", v.image_size)
    writer.add_uint32("clip.vision.patch_size", v.patch_size)
    writer.add_uint32("clip.vision.embedding_length", v.n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", v.n_ff)
    writer.add_uint32("clip.vision.block_count", v.n_layer)
    writer.add_uint32("clip.vision.projection_dim", n_embd_text)
    writer.add_uint32("clip.vision.attention.head_count", v.n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_llm.demo",
        description="Write a tiny llama GGUF with random weights (for tests and demos).",
    )
    parser.add_argument("path", nargs="?", help="output .gguf file")
    parser.add_argument("--install", metavar="NAME", help="also add it to the model store")
    parser.add_argument(
        "--vision",
        action="store_true",
        help="the tiny vision model: a model and its projector, mmproj-<name>.gguf beside it",
    )
    parser.add_argument("--n-embd", type=int, default=DemoModelSpec.n_embd)
    parser.add_argument("--n-layer", type=int, default=DemoModelSpec.n_layer)
    parser.add_argument("--n-ff", type=int, default=DemoModelSpec.n_ff)
    parser.add_argument("--n-head", type=int, default=DemoModelSpec.n_head)
    parser.add_argument("--n-head-kv", type=int, default=DemoModelSpec.n_head_kv)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", choices=ARCHS, default=DemoModelSpec.arch)
    parser.add_argument(
        "--pooling-type", type=int, choices=range(5), help="0 none, 1 mean, 2 CLS, 3 last, 4 rank"
    )
    args = parser.parse_args(argv)
    if not args.path and not args.install:
        parser.error("give a path, --install NAME, or both")
    spec = DemoModelSpec(
        n_embd=args.n_embd,
        n_layer=args.n_layer,
        n_ff=args.n_ff,
        n_head=args.n_head,
        n_head_kv=args.n_head_kv,
        seed=args.seed,
        arch=args.arch,
        pooling_type=args.pooling_type,
    )
    if args.vision:  # vision-runner's writer, in this module once both branches are merged
        from jupyter_llm.demo import write_vision_model
    if args.install:
        import tempfile

        from jupyter_llm.config import Settings
        from jupyter_llm.models.store import ModelStore

        store = ModelStore(Settings.from_env().models_dir)
        with tempfile.TemporaryDirectory(dir=store.root) as tmp:
            if args.vision:  # the store tells the projector from the model by its header
                files = write_vision_model(Path(tmp), "demo")
            else:
                files = (write_demo_model(Path(tmp) / "demo.gguf", spec),)
            store.create(args.install, {f.name: store.add_blob_from_file(f) for f in files})
        print(f"installed {args.install} into {store.root}")
    if args.path and args.vision:
        path = Path(args.path)
        print(*write_vision_model(path.parent, path.name.removesuffix(".gguf")), sep="\n")
    elif args.path:
        print(write_demo_model(args.path, spec))
    return 0


def _finish(writer: Any, tmp: Path, path: Path) -> None:
    """Write a ``gguf.GGUFWriter`` under its temporary name, then move it into place: a
    failed write leaves no half-written model behind."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


if __name__ == "__main__":
    sys.exit(main())
