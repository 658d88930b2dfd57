"""A model without a chat template chats in its family's turn format (issue
24, item 7): the choice as a table, the templates against llama.cpp's
built-in ones of the same name, the runner and ``/api/show`` choosing alike,
and the real Gemma 3 270M (whose GGUF on PyPI has no template) end to end."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llama_cpp
import pytest

from jupyter_llm.chat_formats.builtin import BUILTIN, choose_builtin_name
from jupyter_llm.chat_formats.detect import FALLBACK, detect_format
from jupyter_llm.demo import DemoModelSpec, write_demo_model
from jupyter_llm.models.gguf_info import builtin_template, read_metadata
from jupyter_llm.models.store import ModelStore
from jupyter_llm.runner.chat_template import ChatTemplate
from jupyter_llm.runner.model import Model
from jupyter_llm.runner.protocol import LoadParams

L3, IM, SEP, SYS, INST, GEM = (
    "<|start_header_id|>",
    "<|im_start|>",
    "<|im_sep|>",
    "[SYSTEM_PROMPT]",
    "[INST]",
    "<start_of_turn>",
)

CHOICES = [  # architecture, marker tokens in the vocabulary, tokenizer.ggml.pre, chosen
    ("gemma", set(), "default", "gemma"),
    ("gemma2", set(), "default", "gemma"),
    ("gemma3", set(), "default", "gemma"),
    ("gemma3n", {GEM}, "default", "gemma"),
    ("qwen2", {IM}, "qwen2", "chatml"),
    ("qwen3", set(), "qwen2", "chatml"),
    ("qwen3moe", {IM}, "qwen2", "chatml"),
    ("phi3", set(), "default", "phi3"),
    ("phi3", {IM, SEP}, "dbrx", "phi4"),
    ("granite", set(), "refact", "granite"),
    ("granitemoe", set(), "refact", "granite"),
    ("mistral3", {SYS, INST}, "tekken", "mistral-v7-tekken"),
    ("llama", {L3}, "llama-bpe", "llama3"),
    ("llama", {L3, IM}, "llama-bpe", "llama3"),  # a Llama 3 fine-tune with ChatML added
    ("llama", {SYS, INST}, "tekken", "mistral-v7-tekken"),  # Mistral Small 3
    ("llama", {SYS, INST}, "default", "mistral-v7"),
    ("llama", {INST}, "tekken", "mistral-v3-tekken"),  # Mistral Nemo
    ("llama", {INST}, "default", "mistral-v3"),  # Mistral 7B v0.3
    ("llama", {IM}, "smollm", "chatml"),  # SmolLM2
    ("llama", set(), "default", "llama2-sys-bos"),  # Llama 2, Mistral 7B v0.1
    ("internlm2", {IM}, "default", "chatml"),
    ("olmo2", {IM, SEP}, "dbrx", "phi4"),
    ("exotic", {GEM}, "default", "gemma"),
    ("exotic", {L3}, "default", "llama3"),
    ("exotic", set(), "default", None),  # nothing known: the plain fallback
    ("bert", {IM}, "default", None),  # an encoder does not chat
    ("nomic-bert", set(), "default", None),
]


@pytest.mark.parametrize(("arch", "markers", "pre", "chosen"), CHOICES)
def test_the_template_is_chosen_by_architecture_then_by_markers(arch, markers, pre, chosen):
    assert choose_builtin_name(arch, markers.__contains__, pre) == chosen


def test_an_unambiguous_architecture_reads_no_vocabulary():
    def no_vocabulary(text: str) -> bool:
        raise AssertionError(f"asked for {text}")

    for arch in ("gemma3", "qwen2", "granite", "mistral3"):
        assert choose_builtin_name(arch, no_vocabulary) is not None


CONVERSATIONS = {
    "user": [("user", "U")],
    "system": [("system", "S"), ("user", "U")],
    "two turns": [("system", "S"), ("user", "U1"), ("assistant", "A1"), ("user", "U2")],
    "no system": [("user", "U1"), ("assistant", "A1"), ("user", "U2")],
    "late system": [("user", "U1"), ("assistant", "A1"), ("system", "S"), ("user", "U2")],
    "ends answered": [("user", "U"), ("assistant", "A")],
    "spaces": [("system", " S \n"), ("user", "  U \n"), ("assistant", " A \n"), ("user", "U2")],
}
# where ours departs from llama.cpp on purpose, or where llama.cpp's own
# whitespace handling is uneven (it trims only Mistral v3's answers)
DIFFERENT = {("mistral-v3", "spaces")}


def llama_cpp_render(name: str, conversation: list[tuple[str, str]]) -> str:
    """llama.cpp's built-in template ``name`` applied to ``conversation``."""
    chat = (llama_cpp.llama_chat_message * len(conversation))()
    kept = []
    for i, (role, content) in enumerate(conversation):
        kept += [role.encode(), content.encode()]
        chat[i].role, chat[i].content = kept[-2], kept[-1]
    buf = ctypes.create_string_buffer(1 << 14)
    n = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(chat), True, buf, len(buf))
    assert 0 <= n < len(buf)
    return buf.raw[:n].decode()


def test_every_builtin_is_one_of_llama_cpps():
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    assert set(BUILTIN) <= {name.decode() for name in names}


@pytest.mark.parametrize("name", sorted(BUILTIN))
@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_a_builtin_renders_as_llama_cpps_of_the_same_name(name, case):
    if (name, case) in DIFFERENT:
        pytest.skip("a difference on purpose")
    conversation = CONVERSATIONS[case]
    messages = [{"role": role, "content": content} for role, content in conversation]
    ours = ChatTemplate(BUILTIN[name].source, "", "").render(messages)
    assert ours == llama_cpp_render(name, conversation)


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_a_builtin_keeps_what_llama_cpp_would_drop_or_run_together(name):
    """Two system messages stay apart, and a system prompt alone is still shown."""
    template = ChatTemplate(BUILTIN[name].source, "", "")
    systems = [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"}]
    two = template.render([*systems, {"role": "user", "content": "U"}])
    assert "S1S2" not in two and two.index("S1") < two.index("S2") < two.index("U")
    alone = template.render([{"role": "system", "content": "Be brief."}])
    assert "Be brief." in alone and "Be brief.\n\n" not in alone  # a closed turn


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_a_builtin_offers_no_tools_or_thinking_and_renders_content_parts(name):
    source = BUILTIN[name].source
    assert detect_format(source) == FALLBACK  # the server's capabilities and the runner agree
    template = ChatTemplate(source, "", "")
    parts = [
        {"type": "text", "text": "Hello "},
        {"type": "image_url"},
        {"type": "text", "text": "x"},
    ]
    assert "Hello x" in template.render([{"role": "user", "content": parts}])


@pytest.mark.parametrize(
    ("spec", "chosen"),
    [
        (DemoModelSpec(chat_template=""), "chatml"),  # llama with <|im_start|>
        (
            DemoModelSpec(chat_template="", extra_tokens=(L3, "<|end_header_id|>", "<|eot_id|>")),
            "llama3",
        ),
        (DemoModelSpec(chat_template="", extra_tokens=(INST, "[/INST]")), "mistral-v3"),
        (DemoModelSpec(chat_template="", arch="qwen3"), "chatml"),
        (DemoModelSpec(chat_template="", arch="bert", n_head_kv=4, pooling_type=1), ""),
        (DemoModelSpec(), ""),  # its own template
    ],
)
def test_the_runner_and_the_server_choose_alike(tmp_path, spec, chosen):
    path = write_demo_model(tmp_path / "m.gguf", spec)
    model = Model(LoadParams(path=str(path)))  # the model alone: no context
    try:
        assert model.builtin_template == chosen
        served = builtin_template(path, read_metadata(path))
        assert (served.name if served else "") == chosen
        if chosen:
            assert model.chat_template == BUILTIN[chosen].source
            ends = model.tokenize(BUILTIN[chosen].turn_end, add_special=False)
            assert len(ends) == 1 and llama_cpp.llama_vocab_is_eog(model.vocab, ends[0])
    finally:
        model.close()


# -- the real Gemma 3 270M ---------------------------------------------------------------

TWO_TURNS = [
    {"role": "system", "content": "Answer in one short sentence."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "The sky is blue."},
    {"role": "user", "content": "And the grass?"},
]
GEMMA_PROMPT = (
    "<start_of_turn>user\nAnswer in one short sentence.\n\nWhat colour is the sky?<end_of_turn>\n"
    "<start_of_turn>model\nThe sky is blue.<end_of_turn>\n"
    "<start_of_turn>user\nAnd the grass?<end_of_turn>\n"
    "<start_of_turn>model\n"
)
GREEDY = {"temperature": 0, "num_predict": 64, "seed": 1}


def test_gemma_renders_its_turns_and_ends_them_with_end_of_turn(gemma_gguf: Path):
    model = Model(LoadParams(path=str(gemma_gguf)))
    try:
        assert model.builtin_template == "gemma"
        assert model.render_chat(TWO_TURNS) == GEMMA_PROMPT
        (end,) = model.tokenize("<end_of_turn>", add_special=False)
        assert llama_cpp.llama_vocab_is_eog(model.vocab, end)
    finally:
        model.close()


@pytest.fixture
def gemma_model(models_dir: Path, gemma_gguf: Path) -> str:
    store = ModelStore(models_dir)
    store.create("gemma", {"gemma.gguf": store.add_blob_from_file(gemma_gguf)})
    return "gemma"


async def post(jp_fetch, path: str, body: dict) -> dict:
    r = await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    return json.loads(r.body)


async def test_gemma_without_a_template_chats_in_its_own_turns(jp_fetch, gemma_model):
    show = await post(jp_fetch, "api/show", {"model": gemma_model})
    assert show["details"]["builtin_template"] == "gemma"
    assert show["template"] == BUILTIN["gemma"].source
    assert show["capabilities"] == ["completion"]
    assert "tokenizer.chat_template" not in show["model_info"]  # the file is as it was

    chat = await post(
        jp_fetch,
        "api/chat",
        {"model": gemma_model, "messages": TWO_TURNS, "stream": False, "options": GREEDY},
    )
    answer = chat["message"]["content"]
    assert chat["done_reason"] in ("stop", "length")
    assert answer.strip()
    for invented in ("user:", "assistant:", "model:", "<start_of_turn>", "<end_of_turn>"):
        assert invented not in answer.lower()
    # the same prompt, given raw, is the same number of tokens and the same answer:
    # the runner rendered exactly Gemma's turns
    raw = await post(
        jp_fetch,
        "api/generate",
        {
            "model": gemma_model,
            "prompt": GEMMA_PROMPT,
            "raw": True,
            "stream": False,
            "options": GREEDY,
        },
    )
    assert raw["prompt_eval_count"] == chat["prompt_eval_count"]
    assert raw["response"] == answer


async def test_a_model_with_its_own_template_names_no_builtin(jp_fetch, installed_model):
    show = await post(jp_fetch, "api/show", {"model": installed_model})
    assert "builtin_template" not in show["details"]
    assert "im_start" in show["template"]
