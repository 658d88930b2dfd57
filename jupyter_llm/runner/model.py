"""The loaded model: its weights, its vocabulary and its templates.

``Model`` turns text into this model's tokens and tokens back into text
(pieces, control tokens, fill-in-the-middle), renders its chat template
(the GGUF's own, or its family's built-in one), reads its metadata, and
holds its image projector (``runner.vision``) once one is opened. It owns
no context: the batch loop (``runner.engine``) and the embeddings
(``runner.embedding_context``) each make their own over these weights.
Runs in the runner process only; everything here blocks.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable
from typing import Any

import llama_cpp

from jupyter_llm.chat_formats.builtin import choose_builtin
from jupyter_llm.runner.chat_template import ChatTemplate
from jupyter_llm.runner.constrained import TokenTable, token_piece
from jupyter_llm.runner.llama_backend import init_backend
from jupyter_llm.runner.pooling import legacy_normalizes
from jupyter_llm.runner.protocol import EngineError, InputError, LoadParams
from jupyter_llm.runner.vision import ImagePrompt, Part, Vision


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Does this (Linux) CPU advertise AMX, whose llama.cpp kernels we avoid?"""
    try:
        with open(cpuinfo) as f:
            return any(line.startswith("flags") and " amx_int8" in line for line in f)
    except OSError:
        return False


def model_params(
    params: LoadParams, progress: Callable[[float], None] | None
) -> tuple[Any, list[Any]]:
    """llama.cpp's model parameters for ``params`` (a load message), and the
    C objects they point to, which must outlive the load."""
    mp = llama_cpp.llama_model_default_params()
    keep: list[Any] = []
    if progress is not None:

        def on_progress(value: float, _: ctypes.c_void_p) -> bool:
            progress(float(value))
            return True

        callback = llama_cpp.llama_progress_callback(on_progress)
        keep.append(callback)
        mp.progress_callback = callback
    mp.n_gpu_layers = params.n_gpu_layers
    if cpu_has_amx() or params.batch_invariant:
        # llama.cpp's AMX kernels crash on real quantized models on some
        # Sapphire Rapids machines (ggml-org/llama.cpp#20824, unfixed); and
        # the repacked weights' product takes rows 4 at a time through
        # another kernel than the rest, which a batch-invariant load cannot
        # have: the weights stay in plain CPU buffers there
        mp.use_extra_bufts = False
    mp.main_gpu = params.main_gpu
    mp.use_mmap = params.use_mmap
    if params.tensor_split:
        split = (ctypes.c_float * len(params.tensor_split))(*params.tensor_split)
        keep.append(split)
        mp.tensor_split = split
    return mp, keep


class Model:
    """One GGUF's weights and vocabulary, loaded; see the module docstring."""

    def __init__(self, params: LoadParams, progress: Callable[[float], None] | None = None) -> None:
        init_backend()
        mp, self._load_refs = model_params(params, progress)
        self.llama_model = llama_cpp.llama_model_load_from_file(params.path.encode(), mp)
        if not self.llama_model:
            raise EngineError(f"failed to load model {params.path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.llama_model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.llama_model)
        self.n_swa = int(llama_cpp.llama_model_n_swa(self.llama_model))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self._piece = ctypes.create_string_buffer(256)
        self.tokens = TokenTable(
            self.vocab,
            self.n_vocab,
            self.piece,
            lambda text: self.tokenize(text, add_special=False, parse_special=False),
        )
        self._reading_vocab: Any = self.tokens.prepare()
        # the GGUF's own template, or its family's built-in one (named here)
        self.chat_template, self.builtin_template = self._chat_template_source()
        self._chat: ChatTemplate | None = None
        self.vision: Vision | None = None

    def open_projector(self, projector: str, n_threads: int, use_gpu: bool) -> None:
        """Load the image projector (mmproj GGUF) beside the weights."""
        self.vision = Vision(projector, self.llama_model, n_threads, use_gpu)

    def close(self) -> None:
        if self._reading_vocab is not None:
            self._reading_vocab.join()  # it reads the vocabulary freed below
            self._reading_vocab = None
        self.tokens.join()  # so does the trie's build, where a grammar started it
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        if self.llama_model:
            llama_cpp.llama_model_free(self.llama_model)
            self.llama_model = None

    # -- model facts -----------------------------------------------------------------
    @property
    def recurrent(self) -> bool:
        """A recurrent state (Mamba, RWKV, hybrids): llama.cpp cannot drop its
        last positions (no drafts, no step taken back) and splits a batch into
        equal-length ubatches."""
        return has_recurrent_state(self.llama_model)

    def metadata(self, key: str) -> str:
        """A metadata value as text; a long one (a chat template over 64 KiB)
        is read again whole rather than cut."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.llama_model, key.encode(), buf, len(buf))
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            n = llama_cpp.llama_model_meta_val_str(self.llama_model, key.encode(), buf, len(buf))
        return buf.value.decode(errors="replace") if n >= 0 else ""

    @property
    def n_embd(self) -> int:
        """The length of an embedding (the output size where a model projects)."""
        return int(llama_cpp.llama_model_n_embd_out(self.llama_model))

    def legacy_normalizes(self) -> bool:
        """Whether the legacy ``/api/embeddings`` normalises this model's vectors."""
        arch = self.metadata("general.architecture")
        flag = self.metadata(f"{arch}.normalize_embeddings").lower()
        return legacy_normalizes(
            arch,
            declares_pooling=bool(self.metadata(f"{arch}.pooling_type")),
            tokenizer=self.metadata("tokenizer.ggml.model"),
            normalize_embeddings={"true": True, "false": False}.get(flag),
        )

    @property
    def supports_insert(self) -> bool:
        return llama_cpp.llama_vocab_fim_pre(self.vocab) >= 0

    # -- vocabulary ------------------------------------------------------------------
    def token_text(self, token: int, special: bool = True) -> str:
        return self.piece(token, special).decode(errors="replace")

    def piece(self, token: int, special: bool = False) -> bytes:
        """A token's bytes (the main thread's buffer: one caller at a time)."""
        return token_piece(self.vocab, token, special, self._piece)

    def control_tokens(self, markers: Iterable[str]) -> frozenset[int]:
        """The ids of those ``markers`` that are one control token of this
        vocabulary (rendered as nothing unless kept, see ``Job.preserve``)."""
        found = set()
        for marker in markers:
            ids = self.tokenize(marker, add_special=False, parse_special=True)
            if len(ids) == 1 and not self.piece(ids[0], special=False):
                found.add(ids[0])
        return frozenset(found)

    def tokenize(
        self, text: str | bytes, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buf, cap, add_special, parse_special
        )
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, cap, add_special, parse_special
            )
        return list(buf[:n])

    def _has_marker(self, text: str) -> bool:
        """Whether ``text`` is one control or user-defined token (as the
        server reads a GGUF's token types, ``models.gguf_info.marker_tokens``)."""
        ids = self.tokenize(text, add_special=False, parse_special=True)
        marker = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        return len(ids) == 1 and bool(llama_cpp.llama_vocab_get_attr(self.vocab, ids[0]) & marker)

    # -- prompts ---------------------------------------------------------------------
    def _chat_template_source(self) -> tuple[str, str]:
        """The chat template and, where the GGUF has none and the model's
        family is known, the name of the built-in one chosen for it (""
        where it is the GGUF's own, or where nothing is known)."""
        own = self.metadata("tokenizer.chat_template")
        if own:
            return own, ""
        builtin = choose_builtin(
            self.metadata("general.architecture"),
            self._has_marker,
            self.metadata("tokenizer.ggml.pre"),
        )
        return (builtin.source, builtin.name) if builtin else ("", "")

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """The model's chat template (Jinja2, as transformers renders it), with
        its work bounded (``chat_template``: a hostile template is a 400); a
        model without one and of no known family gets ``role: content`` lines."""
        if not self.chat_template:
            lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
            return "\n".join([*lines, "assistant: "])
        if self._chat is None:
            bos = llama_cpp.llama_vocab_bos(self.vocab)
            eos = llama_cpp.llama_vocab_eos(self.vocab)
            self._chat = ChatTemplate(
                self.chat_template,
                bos_token=self.token_text(bos) if bos >= 0 else "",
                eos_token=self.token_text(eos) if eos >= 0 else "",
            )
        return self._chat.render(messages, tools, variables)

    def fill_in_the_middle(self, prefix: str, suffix: str) -> list[int]:
        ids = (
            llama_cpp.llama_vocab_fim_pre(self.vocab),
            llama_cpp.llama_vocab_fim_suf(self.vocab),
            llama_cpp.llama_vocab_fim_mid(self.vocab),
        )
        if min(ids) < 0:
            raise InputError("this model does not support insert (no fill-in-the-middle tokens)")
        pre, suf, mid = ids
        return [
            pre,
            *self.tokenize(prefix, add_special=False),
            suf,
            *self.tokenize(suffix, add_special=False),
            mid,
        ]

    def prompt_tokens(
        self, prompt: str, context: list[int] | None = None, suffix: str | None = None
    ) -> list[int]:
        """A request's prompt as tokens: fill-in-the-middle, or ``context``
        (Ollama's generate) followed by the prompt."""
        if suffix is not None:
            tokens = self.fill_in_the_middle(prompt, suffix)
        else:
            tokens = self.tokenize(prompt, add_special=self.add_bos and not context)
        if context:
            self._check_context(context)
            tokens = list(context) + tokens
        if tokens:
            return tokens
        bos = llama_cpp.llama_vocab_bos(self.vocab)
        if bos < 0:  # none (RWKV's and T5's vocabularies): a decode of -1 fails the whole step
            raise InputError("the prompt is empty, and this model has no token to begin one with")
        return [bos]

    def _check_context(self, context: list[int]) -> None:
        if any(not 0 <= t < self.n_vocab for t in context):
            raise InputError("context contains a token id that is not in the vocabulary")

    # -- images ----------------------------------------------------------------------
    @property
    def image_marker(self) -> str:
        """The text that places an image in a plain prompt (mtmd's marker)."""
        return self.require_vision().marker

    def require_vision(self) -> Vision:
        """The projector; an ``InputError`` for a model loaded without one."""
        if self.vision is None:
            raise InputError("this model cannot take images: it was loaded without a projector")
        return self.vision

    def image_prompt(
        self, parts: list[Part], context: list[int] | None, n_batch: int
    ) -> ImagePrompt:
        """A prompt of text and images (file bytes) as tokens and image
        chunks (each decoded within ``n_batch``), after Ollama's ``context``
        if given. It must end with text: the answer starts from the logits
        of its last token."""
        if context:
            self._check_context(context)
        vision = self.require_vision()
        prompt = vision.tokenize(parts, self.add_bos and not context, n_batch)
        if context:
            prompt.tokens[:0] = context
            prompt.images = {s + len(context): im for s, im in prompt.images.items()}
        if not prompt.tokens or any(e == len(prompt.tokens) for _, e in prompt.spans()):
            prompt.close()
            raise InputError("a prompt may not end with an image: put text after it")
        return prompt


def has_recurrent_state(llama_model: Any) -> bool:
    """Does ``llama_model`` keep a recurrent state (``Model.recurrent``)?"""
    return bool(
        llama_cpp.llama_model_is_recurrent(llama_model)
        or llama_cpp.llama_model_is_hybrid(llama_model)
    )
