"""Create variants, Modelfiles, model parameters, and interop with Ollama's store."""

from __future__ import annotations

import hashlib
import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_llm.models.modelfile import parse_modelfile
from jupyter_llm.request.errors import InvalidRequest


async def call(jp_fetch, path, body, method="POST"):
    r = await jp_fetch("llm", *path.split("/"), method=method, body=json.dumps(body))
    return json.loads(r.body) if r.body and not r.body.startswith(b'{"status') else r.body


async def show(jp_fetch, model):
    return await call(jp_fetch, "api/show", {"model": model})


async def test_create_from_existing_with_everything(jp_fetch, installed_model):
    await call(
        jp_fetch,
        "api/create",
        {
            "model": "custom",
            "from": "tiny",
            "system": "You are terse.",
            "template": "{{ .Prompt }}",
            "parameters": {"num_predict": 3, "stop": ["zz"], "temperature": 0},
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
            "license": "MIT",
            "stream": False,
        },
    )
    s = await show(jp_fetch, "custom")
    assert s["system"] == "You are terse." and s["template"] == "{{ .Prompt }}"
    assert s["license"] == "MIT" and len(s["messages"]) == 2
    assert "num_predict" in s["parameters"] and '"zz"' in s["parameters"]
    assert s["details"]["family"] == "llama"
    # the base model is untouched
    assert "system" not in await show(jp_fetch, "tiny")  # empty: left out, as Ollama does


async def test_parameters_sit_beneath_request_options(jp_fetch, installed_model):
    await call(
        jp_fetch,
        "api/create",
        {
            "model": "three",
            "from": "tiny",
            "stream": False,
            "parameters": {"num_predict": 3, "temperature": 0},
        },
    )
    body = {"model": "three", "prompt": "hi", "stream": False}
    assert (await call(jp_fetch, "api/generate", body))["eval_count"] == 3
    body["options"] = {"num_predict": 5}
    assert (await call(jp_fetch, "api/generate", body))["eval_count"] == 5


async def test_model_system_and_messages_reach_the_template(jp_fetch, installed_model):
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "options": {"num_predict": 1},
    }
    plain = await call(jp_fetch, "api/chat", {"model": "tiny", **chat})
    await call(
        jp_fetch,
        "api/create",
        {
            "model": "primed",
            "from": "tiny",
            "stream": False,
            "system": "sys",
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
        },
    )
    primed = await call(jp_fetch, "api/chat", {"model": "primed", **chat})
    assert primed["prompt_eval_count"] > plain["prompt_eval_count"] + 10
    # a request's own system message replaces the model's ("mine" vs "sys": 1 byte more)
    own = await call(
        jp_fetch,
        "api/chat",
        {
            "model": "primed",
            **chat,
            "messages": [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}],
        },
    )
    assert own["prompt_eval_count"] == primed["prompt_eval_count"] + 1


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"model": "x", "from": "nope"}, "not found"),
        ({"model": "x", "from": "tiny", "parameters": {"bogus": 1, "top_k": 0.5}}, "top_k"),
        ({"model": "x", "from": "tiny", "parameters": {"temperature": "hot"}}, "temperature"),
        ({"model": "x", "from": "tiny", "messages": [{"role": "x"}]}, "messages[0].role"),
        ({"model": "x", "from": "tiny", "license": 3}, "license"),
        ({"model": "x", "files": {"a.gguf": "sha256:" + "0" * 64}, "from": "tiny"}, "either"),
        ({"model": "../x", "from": "tiny"}, "invalid model name"),
        ({"model": "x", "from": "tiny", "license": ["MIT"] * 17}, "(licenses)"),
        (
            {
                "model": "x",
                "from": "tiny",
                "messages": [{"role": "user", "content": "m" * (5 << 20)}],
            },
            "messages has 5,242,",  # the layer's JSON, over text_layer's 4 MiB
        ),
    ],
)
async def test_create_bad_input(jp_fetch, installed_model, body, match):
    with pytest.raises(HTTPClientError) as info:
        await call(jp_fetch, "api/create", body)
    assert info.value.code in (400, 404)
    assert match in json.loads(info.value.response.body)["error"]
    names = [m["name"] for m in json.loads((await jp_fetch("llm", "api", "tags")).body)["models"]]
    assert "x:latest" not in names
    with pytest.raises(HTTPClientError) as info:  # not even a manifest /api/tags hides
        await show(jp_fetch, "x")
    assert info.value.code == 404


async def test_a_model_the_store_cannot_read_is_still_deleted(
    jp_fetch, installed_model, models_dir, monkeypatch
):
    from jupyter_llm.models import store as store_module

    messages = [{"role": "user", "content": "m" * 100}]
    store_module.ModelStore(models_dir).create("broken", None, from_model="tiny", messages=messages)
    # its layer over the limit as read now (an older version's, or a store edited by hand)
    monkeypatch.setattr(store_module, "MAX_TEXT_LAYER", 50)
    with pytest.raises(HTTPClientError, match="400"):
        await show(jp_fetch, "broken")
    body = json.dumps({"model": "broken"})
    await jp_fetch(
        "llm", "api", "delete", method="DELETE", body=body, allow_nonstandard_methods=True
    )
    with pytest.raises(HTTPClientError) as info:
        await show(jp_fetch, "broken")
    assert info.value.code == 404


MODELFILE = '''
# a comment
FROM tiny
PARAMETER temperature 0.2
PARAMETER num_ctx 1024
PARAMETER stop "<|im_end|>"
PARAMETER stop "###"
SYSTEM """
You answer
in two lines.
"""
TEMPLATE "{{ .Prompt }}"
MESSAGE user Hello there
MESSAGE assistant Hi!
LICENSE """MIT"""
'''


def test_parse_modelfile():
    m = parse_modelfile(MODELFILE)
    assert m.source == "tiny" and not m.from_file
    assert m.parameters == {"temperature": 0.2, "num_ctx": 1024, "stop": ["<|im_end|>", "###"]}
    assert m.system == "\nYou answer\nin two lines.\n" and m.template == "{{ .Prompt }}"
    assert m.messages == [
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi!"},
    ]
    assert m.license == ["MIT"]
    body = m.create_request("mine")
    assert body["from"] == "tiny" and body["parameters"]["num_ctx"] == 1024


def test_a_quoted_argument_goes_on_over_lines_as_ollama_writes_it():
    """Ollama's modelfile (and /api/show's) quotes text with newlines and no
    '"' in single quotes, over several lines; its parser reads them back."""
    text = (
        'FROM m\nTEMPLATE "{{ .System }}\n{{ .Prompt }}"\nSYSTEM "line one\nline two"\n'
        'PARAMETER stop "a\nb"\nMESSAGE user "hi\nthere"\nLICENSE "MIT\n\nfree"\n'
    )
    mf = parse_modelfile(text)
    assert mf.template == "{{ .System }}\n{{ .Prompt }}"
    assert mf.system == "line one\nline two"
    assert mf.parameters["stop"] == ["a\nb"]
    assert mf.messages == [{"role": "user", "content": "hi\nthere"}]
    assert mf.license == ["MIT\n\nfree"]
    # no later line closes it: the '"' is the text (a stop of '"'), as before
    with pytest.raises(InvalidRequest, match="line 3: unknown command 'at'"):
        parse_modelfile('FROM m\nSYSTEM "no end\nat all\n')
    kept = parse_modelfile(
        'FROM m\nPARAMETER stop "\nSYSTEM be brief\nTEMPLATE """{{ .Prompt }}"""'
    )
    assert kept.parameters["stop"] == ['"']
    assert (kept.system, kept.template) == ("be brief", "{{ .Prompt }}")


@pytest.mark.parametrize(
    "params, system, messages",
    [  # text the writer quotes over lines, kept exactly: Ollama trims, then unquotes
        ({"stop": ["\n\n", "\nUser:", " x "]}, "a", []),
        ({}, 'two\nlines "q"', []),  # ends with '"': the last \"\"\" closes
        ({}, "\nstarts with a newline", [{"role": "user", "content": "\n hi \n"}]),
        ({"stop": ['"']}, "s", [{"role": "assistant", "content": 'say "x"'}]),
    ],
)
def test_the_modelfile_show_writes_reads_back_exactly(params, system, messages):
    from datetime import UTC, datetime
    from pathlib import Path

    from jupyter_llm.api.ollama_shapes import modelfile_text
    from jupyter_llm.models.names import parse_model_name
    from jupyter_llm.models.store import ModelEntry

    entry = ModelEntry(
        name=parse_model_name("m"),
        model_path=Path("/m/blobs/sha256-" + "a" * 64),
        digest="d",
        size=1,
        modified_at=datetime.now(UTC),
        template=None,
        system=system,
        config={},
        params=params,
        messages=messages,
    )
    parsed = parse_modelfile(modelfile_text(entry))
    assert (parsed.parameters, parsed.system, parsed.messages) == (params, system, messages)


def test_modelfile_from_a_file():
    assert parse_modelfile("FROM ./models/x.gguf").from_file
    assert parse_modelfile("FROM /abs/x.gguf").from_file
    assert not parse_modelfile("FROM library/llama3:8b").from_file


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("PARAMETER temperature 1", "no FROM"),
        ("FROM x\nPARAMETER nope 1", "unknown parameter"),
        ("FROM x\nPARAMETER num_ctx big", "not a valid value"),
        ("FROM x\nMESSAGE robot hi", "MESSAGE role"),
        ('FROM x\nSYSTEM """never closed', "unterminated"),
        ("FROM x\nADAPTER ./lora.gguf", "ADAPTER"),
        ("FROM x\nRUN rm -rf /", "unknown command"),
    ],
)
def test_bad_modelfiles(text, match):
    with pytest.raises(InvalidRequest, match=match):
        parse_modelfile(text)


async def test_store_written_in_ollamas_layout_is_listed_and_runs(jp_fetch, models_dir, demo_gguf):
    """Write a model exactly as Ollama lays it out, then use it."""
    blobs = models_dir / "blobs"
    blobs.mkdir(exist_ok=True)

    def blob(data: bytes) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / f"sha256-{digest}").write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    config = json.dumps(
        {
            "model_format": "gguf",
            "model_family": "llama",
            "model_families": ["llama"],
            "model_type": "60K",
            "file_type": "F32",
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": []},
        }
    ).encode()
    params = json.dumps({"num_predict": 4, "stop": ["<|im_end|>"]}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **blob(config)},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", **blob(demo_gguf.read_bytes())},
            {"mediaType": "application/vnd.ollama.image.params", **blob(params)},
            {"mediaType": "application/vnd.ollama.image.license", **blob(b"Apache-2.0")},
        ],
    }
    path = models_dir / "manifests" / "registry.ollama.ai" / "library" / "ollamamodel" / "q4"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(manifest))

    models = json.loads((await jp_fetch("llm", "api", "tags")).body)["models"]
    assert [m["name"] for m in models] == ["ollamamodel:q4"]
    assert models[0]["details"]["parameter_size"] == "60K"
    r = await call(
        jp_fetch, "api/generate", {"model": "ollamamodel:q4", "prompt": "hi", "stream": False}
    )
    assert r["eval_count"] == 4  # its params layer applies
    assert (await show(jp_fetch, "ollamamodel:q4"))["license"] == "Apache-2.0"
