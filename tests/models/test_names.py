import pytest

from jupyter_llm.models.names import parse_model_name
from jupyter_llm.request.errors import InvalidRequest


@pytest.mark.parametrize(
    ("text", "parts", "display"),
    [
        ("llama3", ("registry.ollama.ai", "library", "llama3", "latest"), "llama3:latest"),
        ("llama3:8b", ("registry.ollama.ai", "library", "llama3", "8b"), "llama3:8b"),
        ("me/tiny", ("registry.ollama.ai", "me", "tiny", "latest"), "me/tiny:latest"),
        (
            "hf.co/user/repo:Q4_K_M",
            ("hf.co", "user", "repo", "Q4_K_M"),
            "hf.co/user/repo:Q4_K_M",
        ),
        (
            "localhost:5000/ns/m:v1",
            ("localhost:5000", "ns", "m", "v1"),
            "localhost:5000/ns/m:v1",
        ),
    ],
)
def test_parse(text, parts, display):
    name = parse_model_name(text)
    assert name.manifest_parts() == parts
    assert name.display == display


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  ",
        None,
        3,
        "../etc/passwd",
        "a/../../b",
        "a\x00b",
        "a/b/c/d",
        "/abs",
        "x:",
        "a:b/c",
        "name:../../x",
        "n" * 400,
        "a\\b",
        ".hidden",
        "a/ /b",
    ],
)
def test_invalid(text):
    with pytest.raises(InvalidRequest):
        parse_model_name(text)
