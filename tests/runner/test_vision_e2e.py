"""Images end to end: the generated tiny vision model (a model and its
random-weight projector that mtmd loads) through /api/chat, /api/generate and
the official ``openai`` client. An image reaches the model when the prompt's
token count grows by the image's tokens; a text-only model refuses images."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import openai
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.models.store import ModelStore

GREEDY = {"temperature": 0, "num_predict": 2, "seed": 1}


@pytest.fixture(scope="session")
def vision_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from jupyter_llm.demo import write_vision_model  # the vision-runner branch's

    return write_vision_model(tmp_path_factory.mktemp("vision"), "tiny-vision")


@pytest.fixture
def vision_model(models_dir: Path, vision_files: tuple[Path, Path], installed_model) -> str:
    store = ModelStore(models_dir)
    store.create("seer", {p.name: store.add_blob_from_file(p) for p in vision_files})
    return "seer:latest"


def image(fmt: str = "PNG", size: int = 24) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 90)).save(buffer, fmt)
    return base64.b64encode(buffer.getvalue()).decode()


async def post(jp_fetch, path: str, body: dict) -> dict:
    r = await jp_fetch("llm", *path.split("/"), method="POST", body=json.dumps(body))
    return json.loads(r.body)


@pytest.fixture
def client(openai_client):
    return openai_client


async def test_an_image_reaches_the_model_through_chat(jp_fetch, vision_model):
    def chat(images: list[str]) -> dict:
        message = {"role": "user", "content": "what is this?"}
        if images:
            message["images"] = images
        return {"model": "seer", "messages": [message], "stream": False, "options": GREEDY}

    text = await post(jp_fetch, "api/chat", chat([]))
    one = await post(jp_fetch, "api/chat", chat([image()]))
    two = await post(jp_fetch, "api/chat", chat([image(), image("JPEG")]))
    per_image = one["prompt_eval_count"] - text["prompt_eval_count"]
    assert per_image > 0, (text, one)
    # the same size of image: as many tokens again
    assert two["prompt_eval_count"] - one["prompt_eval_count"] == per_image
    ps = await jp_fetch("llm", "api", "ps")
    (loaded,) = [m for m in json.loads(ps.body)["models"] if m["name"] == "seer:latest"]
    assert loaded["vision"] is True


async def test_an_image_reaches_the_model_through_generate(jp_fetch, vision_model):
    body = {"model": "seer", "prompt": "describe", "stream": False, "options": GREEDY}
    text = await post(jp_fetch, "api/generate", body)
    seen = await post(jp_fetch, "api/generate", {**body, "images": [image("GIF")]})
    assert seen["prompt_eval_count"] > text["prompt_eval_count"]
    raw = await post(jp_fetch, "api/generate", {**body, "raw": True, "images": [image("BMP")]})
    plain_raw = await post(jp_fetch, "api/generate", {**body, "raw": True})
    assert raw["prompt_eval_count"] > plain_raw["prompt_eval_count"]


async def test_the_openai_client_sends_an_image_url_part(client, vision_model):
    async def ask(parts: list[dict]) -> int:
        r = await client.chat.completions.create(
            model="seer",
            messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, *parts]}],
            max_tokens=2,
            temperature=0,
        )
        return r.usage.prompt_tokens

    url = {"url": f"data:image/png;base64,{image()}", "detail": "low"}
    assert await ask([{"type": "image_url", "image_url": url}]) > await ask([])
    with pytest.raises(openai.BadRequestError, match="does not fetch image URLs"):
        await ask([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}])
    with pytest.raises(openai.BadRequestError, match="does not support images"):
        await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": url}]}],
            max_tokens=2,
        )


async def test_a_text_only_model_refuses_images(jp_fetch, vision_model):
    body = {"model": "tiny", "prompt": "x", "images": [image()], "stream": False}
    with pytest.raises(HTTPClientError) as e:
        await post(jp_fetch, "api/generate", body)
    assert e.value.code == 400
    assert json.loads(e.value.response.body)["error"] == (
        "model 'tiny:latest' does not support images"
    )


async def test_show_of_the_generated_vision_model(jp_fetch, vision_model):
    shown = await post(jp_fetch, "api/show", {"model": "seer"})
    assert "vision" in shown["capabilities"]
    assert shown["projector_info"]["general.architecture"] == "clip"


def test_the_demo_installs_the_vision_model_with_its_projector(tmp_path, monkeypatch):
    from jupyter_llm.demo import main

    monkeypatch.setenv("JUPYTER_LLM_MODELS", str(tmp_path))
    assert main(["--vision", "--install", "demo-vision"]) == 0
    entry = ModelStore(tmp_path).get("demo-vision")
    assert entry.vision and entry.details["families"][-1] == "clip"
