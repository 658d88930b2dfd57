"""What each peer makes of our errors: an unknown model, a missing token, an
API we do not have. Each must reach the user as that client's own error
type, with our message in it (a status and a JSON body it can parse)."""

from __future__ import annotations

import os

import ollama
import openai
import pytest
from conftest import Peer
from langchain_ollama import ChatOllama
from langchain_openai import ChatOpenAI

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_TELEMETRY", "False")

ASK = [{"role": "user", "content": "hi"}]


def test_an_unknown_model(peer: Peer) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        ChatOllama(
            model="nope", base_url=peer.ollama, client_kwargs={"headers": peer.headers}
        ).invoke("hi")
    assert e.value.status_code == 404 and "nope" in e.value.error

    with pytest.raises(openai.NotFoundError) as n:
        ChatOpenAI(model="nope", base_url=peer.openai, api_key=peer.token, max_retries=0).invoke(
            "hi"
        )
    assert "nope" in n.value.message


@pytest.mark.filterwarnings("ignore:.*ReadOnly. qualifier:UserWarning")
def test_an_unknown_model_through_litellm(peer: Peer) -> None:
    import litellm

    for provider, base in (("ollama_chat", peer.ollama), ("openai", peer.openai)):
        with pytest.raises(litellm.NotFoundError) as e:
            litellm.completion(
                model=f"{provider}/nope",
                messages=ASK,
                api_base=base,
                api_key=peer.token,
                max_retries=0,
            )
        assert "nope" in str(e.value)


def test_no_token(peer: Peer) -> None:
    """A client without the token hears that it needs one, and how to send it."""
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=peer.ollama).chat(model="tiny", messages=ASK)
    assert e.value.status_code == 403 and "token" in e.value.error

    client = openai.OpenAI(base_url=peer.openai, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as o:  # OpenAI's 401
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=2)
    assert "token" in o.value.message


def test_an_unknown_openai_route_is_a_json_404(peer: Peer) -> None:
    """A route we do not serve (the Files API): the client must read
    that from a JSON error, not an HTML page."""
    client = openai.OpenAI(base_url=peer.openai, api_key=peer.token, max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.files.list()
    assert isinstance(e.value.body, dict) and e.value.body.get("message")
