import gguf
import pytest

from jupyter_llm.demo import DemoModelSpec, write_demo_model


def test_demo_model_is_valid_gguf(tmp_path):
    path = write_demo_model(tmp_path / "m.gguf", DemoModelSpec(n_embd=32, n_layer=3, n_ff=64))
    reader = gguf.GGUFReader(str(path))
    assert reader.get_field("general.architecture").contents() == "llama"
    assert reader.get_field("llama.block_count").contents() == 3
    tokens = reader.get_field("tokenizer.ggml.tokens").contents()
    assert len(tokens) >= 258
    assert reader.get_field("tokenizer.ggml.merges").contents()
    assert "im_start" in reader.get_field("tokenizer.chat_template").contents()
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "blk.2.ffn_down.weight"} <= names
    assert not list(tmp_path.glob(".*tmp"))


def test_demo_model_is_deterministic(tmp_path):
    a = write_demo_model(tmp_path / "a.gguf", DemoModelSpec(seed=3))
    b = write_demo_model(tmp_path / "b.gguf", DemoModelSpec(seed=3))
    assert a.read_bytes() == b.read_bytes()


def test_extra_tokens_are_user_defined_and_appended(tmp_path):
    plain = gguf.GGUFReader(str(write_demo_model(tmp_path / "p.gguf")))
    spec = DemoModelSpec(extra_tokens=("<tool_call>", "</tool_call>"), favourite="<tool_call>")
    extra = gguf.GGUFReader(str(write_demo_model(tmp_path / "e.gguf", spec)))
    before = plain.get_field("tokenizer.ggml.tokens").contents()
    after = extra.get_field("tokenizer.ggml.tokens").contents()
    assert after == [*before, "<tool_call>", "</tool_call>"]
    types = extra.get_field("tokenizer.ggml.token_type").contents()
    assert types[-2:] == [int(gguf.TokenType.USER_DEFINED)] * 2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (DemoModelSpec(favourite="<tool_call>"), "favourite '<tool_call>' is not a token"),
        (DemoModelSpec(extra_tokens=("<s>",)), "'<s>' is already a token"),
        (DemoModelSpec(extra_tokens=("a", "a")), "'a' is already a token"),
    ],
)
def test_bad_extra_tokens_and_favourites_are_refused(tmp_path, spec, message):
    with pytest.raises(ValueError, match=message):
        write_demo_model(tmp_path / "m.gguf", spec)
