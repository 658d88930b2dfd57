"""A draft model for speculative decoding: a second GGUF that shares the
target's vocabulary (Modelfile ``DRAFT``, ``/api/create``'s ``draft``).

The store keeps it as a layer of its own media type (``MEDIA_DRAFT``), the
blob shared with any model that is the same file. ``check_vocabulary`` is
llama.cpp's rule (common_speculative_are_compatible), read from the GGUF
metadata at create time: the same tokenizer model, the same bos/eos where
they are added, vocabularies within ``MAX_VOCAB_DIFFERENCE`` tokens of each
other, and equal token texts from id ``FIRST_CHECKED_TOKEN`` on. The runner
checks again when it loads the pair. Blocking: call it in an executor.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from jupyter_llm.models.gguf_header import LongArray
from jupyter_llm.models.gguf_info import integer, load_header
from jupyter_llm.models.names import ModelName, parse_model_name
from jupyter_llm.request.errors import InvalidRequest

MEDIA_DRAFT = "application/vnd.jupyter-llm.draft"  # the draft model's GGUF
MAX_VOCAB_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
FIRST_CHECKED_TOKEN = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID
MAX_TOKEN_ID = 1 << 31
# llama.cpp adds a bos token by default for these tokenizer models (llama-vocab.cpp)
ADDS_BOS_BY_DEFAULT = ("llama", "bert", "rwkv")
_DIGEST = re.compile(r"sha256[:-][0-9a-f]{64}")


def draft_source(value: object) -> str | ModelName:
    """``/api/create``'s ``draft``: a blob digest (``sha256:<hex>``, an
    uploaded GGUF, as ``files`` takes) or a model name; one string."""
    if not isinstance(value, str):
        raise InvalidRequest("draft must be a string: one model name or blob digest")
    if _DIGEST.fullmatch(value):
        return "sha256:" + value[7:]
    return parse_model_name(value, "draft")


@dataclass(frozen=True)
class Vocabulary:
    """What the rule compares, the token texts left out (read in ``_tokens_hash``)."""

    model: str  # tokenizer.ggml.model: "llama" (SentencePiece), "gpt2" (BPE)...
    n_vocab: int
    add_bos: bool
    bos: int
    add_eos: bool
    eos: int


def _vocabulary(path: Path) -> Vocabulary:
    meta = load_header(path, array_limit=0).metadata  # the token list's length only
    model = meta.get("tokenizer.ggml.model", "")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(model, str) or not isinstance(tokens, list | LongArray):
        raise InvalidRequest(f"invalid model file {path.name}: it has no tokenizer")

    def flag(key: str, default: bool) -> bool:
        value = meta.get(key, default)
        return value if isinstance(value, bool) else default

    return Vocabulary(
        model=model[:64],
        n_vocab=len(tokens),
        add_bos=flag("tokenizer.ggml.add_bos_token", model in ADDS_BOS_BY_DEFAULT),
        bos=integer(meta, "tokenizer.ggml.bos_token_id", MAX_TOKEN_ID, MAX_TOKEN_ID),
        add_eos=flag("tokenizer.ggml.add_eos_token", False),
        eos=integer(meta, "tokenizer.ggml.eos_token_id", MAX_TOKEN_ID, MAX_TOKEN_ID),
    )


def _tokens_hash(path: Path, end: int) -> tuple[bytes, list[bytes]]:
    """A sha256 over the token texts ``FIRST_CHECKED_TOKEN..end`` and, to
    name the first difference, one digest per 4,096 tokens; the list of
    texts itself is dropped on return (one vocabulary in memory at a time)."""
    tokens = load_header(path, None).metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or len(tokens) < end:
        raise InvalidRequest(f"invalid model file {path.name}: its token list cannot be read")
    whole, blocks = hashlib.sha256(), []
    for start in range(FIRST_CHECKED_TOKEN, end, 4096):
        block = hashlib.sha256()
        for token in tokens[start : min(end, start + 4096)]:
            raw = str(token).encode("utf-8", "surrogatepass")
            block.update(len(raw).to_bytes(4, "little") + raw)
        blocks.append(block.digest())
        whole.update(block.digest())
    return whole.digest(), blocks


def header_mismatch(t: Vocabulary, d: Vocabulary) -> str:
    """Why vocabularies ``d`` (the draft's) and ``t`` differ in their header
    facts ("" when they agree): all but the token texts."""
    if t.model != d.model:
        return f"tokenizer {d.model!r}, the model's is {t.model!r}"
    for what, added, t_id, d_added, d_id in (
        ("bos", t.add_bos, t.bos, d.add_bos, d.bos),
        ("eos", t.add_eos, t.eos, d.add_eos, d.eos),
    ):
        if added != d_added or (added and t_id != d_id):
            theirs, ours = d_id if d_added else "not added", t_id if added else "not added"
            return f"{what} token {theirs}, the model's is {ours}"
    if abs(t.n_vocab - d.n_vocab) > MAX_VOCAB_DIFFERENCE:
        return (
            f"{d.n_vocab} tokens, the model has {t.n_vocab} (at most {MAX_VOCAB_DIFFERENCE} apart)"
        )
    return ""


def vocabulary_mismatch(target: Path, draft: Path) -> str:
    """Why ``draft`` cannot draft for ``target`` ("" when it can)."""
    t, d = _vocabulary(target), _vocabulary(draft)
    if why := header_mismatch(t, d):
        return why
    end = min(t.n_vocab, d.n_vocab)
    (t_all, t_blocks), (d_all, d_blocks) = _tokens_hash(target, end), _tokens_hash(draft, end)
    if t_all != d_all:
        first = next(i for i, (a, b) in enumerate(zip(t_blocks, d_blocks, strict=True)) if a != b)
        start = FIRST_CHECKED_TOKEN + 4096 * first
        return f"token texts differ between ids {start} and {min(end, start + 4096) - 1}"
    return ""


def check_vocabulary(target: Path, draft: Path, draft_name: str, model_name: str) -> None:
    """``InvalidRequest`` (a 400) unless ``draft`` shares ``target``'s vocabulary."""
    if why := vocabulary_mismatch(target, draft):
        raise InvalidRequest(
            f"draft model {draft_name} does not share {model_name}'s vocabulary ({why})"
        )
