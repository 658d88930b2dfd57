import gguf
import pytest

from jupyter_llm.demo import DemoModelSpec, write_demo_model, write_vision_model


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


def test_vision_model_is_a_text_model_and_its_projector(tmp_path):
    model, projector = write_vision_model(tmp_path, "eyes")
    assert model == tmp_path / "eyes.gguf"
    assert projector == tmp_path / "mmproj-eyes.gguf"  # "an mmproj file next to the GGUF"
    proj = gguf.GGUFReader(str(projector))
    assert proj.get_field("general.architecture").contents() == "clip"
    assert proj.get_field("clip.projector_type").contents() == "mlp"
    text = gguf.GGUFReader(str(model))
    n_embd = text.get_field("llama.embedding_length").contents()
    shapes = {t.name: [int(d) for d in t.shape] for t in proj.tensors}  # ggml order: in, out
    width = proj.get_field("clip.vision.embedding_length").contents()
    assert shapes["mm.0.weight"] == [width, n_embd]  # the projector ends at the text width
    assert shapes["mm.2.weight"] == [n_embd, n_embd]
    assert not list(tmp_path.glob(".*tmp"))


def test_mtmd_accepts_the_projector_and_encodes_an_image(tmp_path):
    """llama.cpp's own multimodal library loads the generated projector with
    the text model and turns an image into that model's embeddings."""
    import ctypes
    import io

    import llama_cpp
    from llama_cpp import mtmd_cpp as mtmd
    from PIL import Image

    model_path, projector = write_vision_model(tmp_path)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(model_path).encode(), llama_cpp.llama_model_default_params()
    )
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.warmup = False, 1, False
    ctx = mtmd.mtmd_init_from_file(str(projector).encode(), model, params)
    assert ctx and mtmd.mtmd_support_vision(ctx)
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(buf, "PNG")
    data = (ctypes.c_uint8 * len(buf.getvalue())).from_buffer_copy(buf.getvalue())
    bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, data, len(data), False)
    assert bitmap
    chunks = mtmd.mtmd_input_chunks_init()
    prompt = mtmd.mtmd_default_marker() + b"what is this?"
    text = mtmd.mtmd_input_text(prompt, len(prompt), True, True)
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
    image = mtmd.mtmd_input_chunks_get(chunks, 0)
    assert mtmd.mtmd_input_chunk_get_type(image) == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE
    n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(image)
    assert n_tokens == 16  # (32 / 8) ** 2 patches
    assert mtmd.mtmd_encode_chunk(ctx, image) == 0
    n_embd = llama_cpp.llama_model_n_embd(model)
    out = mtmd.mtmd_get_output_embd(ctx)
    values = [out[i] for i in range(n_tokens * n_embd)]
    assert any(v != 0.0 for v in values) and all(abs(v) < 1e6 for v in values)
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_free(ctx)
    llama_cpp.llama_model_free(model)


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
