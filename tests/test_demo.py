import gguf

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
