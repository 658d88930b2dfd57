"""The ``insecure`` flag and registry token auth cannot be turned against the
server: plain http only for literal loopback addresses, and a registry's token
URL (its ``WWW-Authenticate`` realm) only on the registry's own host."""

from __future__ import annotations

import json

import pytest
from loopback import LoopbackServer, Remote
from loopback import pull_events as pull
from tornado.httpclient import HTTPClientError

from jupyter_llm.models.hosts import check_realm, is_loopback, trusted_auth_hosts
from jupyter_llm.request.errors import PullFailed


@pytest.fixture
def elsewhere():
    """Another server on the machine, that a registry must not make us call."""
    other = Remote(token="secret")
    s = LoopbackServer(other)
    yield s
    s.close()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("::ffff:127.0.0.1", True),
        ("127.evil.example", False),
        ("127.0.0.1.nip.io", False),
        ("localhost.evil.example", False),
        ("127.1", False),  # not a literal address
        ("0x7f000001", False),
        ("128.0.0.1", False),
        ("10.0.0.1", False),
        ("", False),
        (None, False),
    ],
)
def test_only_literal_loopback_addresses_count(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    "url",
    ["http://127.evil.example/m.gguf", "http://localhost.evil.example:8080/m.gguf"],
)
async def test_plain_http_to_a_lookalike_host_needs_insecure(jp_fetch, url):
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("llm", "api", "pull", method="POST", body=json.dumps({"model": url}))
    assert info.value.code == 400
    assert "insecure" in json.loads(info.value.response.body)["error"]


async def test_a_realm_on_another_host_is_not_called(
    jp_fetch, server, remote, elsewhere, demo_gguf
):
    remote.token = "secret"
    remote.realm = f"{elsewhere.base}/token"
    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert "token" in events[-1]["error"] and elsewhere.host in events[-1]["error"]
    assert elsewhere.remote.requests == []


async def test_a_realm_host_can_be_trusted(
    jp_fetch, jp_serverapp, server, remote, elsewhere, demo_gguf
):
    remote.token = "secret"
    remote.realm = f"{elsewhere.base}/token"
    remote.add_model("library", "tiny", "latest", demo_gguf.read_bytes())
    puller = jp_serverapp.web_app.settings["jupyter_llm"].puller
    puller.trusted_auth_hosts = trusted_auth_hosts(elsewhere.host)
    events = await pull(jp_fetch, {"model": f"{server.host}/library/tiny", "insecure": True})
    assert events[-1] == {"status": "success"}
    assert [r.split("?")[0] for r in elsewhere.remote.requests] == ["GET /token"]


@pytest.mark.parametrize(
    ("realm", "registry", "insecure", "trusted", "ok"),
    [
        ("https://reg.example/token", "https://reg.example/v2/x", False, "", True),
        ("https://reg.example:443/token", "https://reg.example/v2/x", False, "", True),
        ("https://REG.example/token", "https://reg.example/v2/x", False, "", True),
        ("https://reg.example:8443/token", "https://reg.example/v2/x", False, "", False),
        ("https://auth.example/token", "https://reg.example/v2/x", False, "", False),
        ("https://auth.example/token", "https://reg.example/v2/x", False, "auth.example", True),
        ("https://auth.example/token", "https://reg.example/v2/x", False, "auth.example:1", False),
        ("http://reg.example/token", "https://reg.example/v2/x", False, "", False),
        ("http://reg.example:443/token", "https://reg.example/v2/x", True, "", True),
        ("http://reg.example/token", "http://reg.example/v2/x", True, "", True),
        ("file:///etc/passwd", "https://reg.example/v2/x", True, "", False),
        ("gopher://reg.example/token", "https://reg.example/v2/x", True, "", False),
        ("https://user@reg.example/token", "https://reg.example/v2/x", False, "", False),
        ("/token", "https://reg.example/v2/x", False, "", False),
        ("https://169.254.169.254/latest", "https://reg.example/v2/x", False, "", False),
        # Ollama's own registry hands out tokens from ollama.com
        ("https://ollama.com:443/token", "https://registry.ollama.ai/v2/x", False, "", True),
        ("https://ollama.com/token", "https://evil.example/v2/x", False, "", False),
    ],
)
def test_check_realm(realm, registry, insecure, trusted, ok):
    hosts = trusted_auth_hosts(trusted)
    if ok:
        check_realm(realm, registry, insecure=insecure, trusted=hosts)
    else:
        with pytest.raises(PullFailed, match="token"):
            check_realm(realm, registry, insecure=insecure, trusted=hosts)


def test_trusted_auth_hosts_parsing():
    assert trusted_auth_hosts(" a.example, B.example:8443 ,,") == frozenset(
        {("a.example", None), ("b.example", 8443)}
    )
    with pytest.raises(ValueError, match="JUPYTER_LLM_TRUSTED_AUTH_HOSTS"):
        trusted_auth_hosts("http://a.example/")
