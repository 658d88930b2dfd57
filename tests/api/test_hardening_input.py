"""Bounds on everything a request (or a pulled manifest) controls: JSON
Schemas and their grammars, Go templates, non-standard JSON numbers,
durations, model names, model parameters; and the Jinja2 sandbox that chat
templates run in.

Nothing here measures how fast the machine is: inputs are bounded by size
and structure, and the one deadline is the issue's own (another client is
answered within 1 s while an attack request is handled)."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from jupyter_llm.api.requests import parse_json_object
from jupyter_llm.api.structured import LIMITS, bounded_schema, parse_format
from jupyter_llm.api.templates import render_go_template
from jupyter_llm.models.names import parse_model_name
from jupyter_llm.request.durations import FOREVER, parse_duration
from jupyter_llm.request.errors import InvalidRequest
from jupyter_llm.request.options import check_option, model_params, parse_options

ATTACK = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 2147483647}}}
CAP = LIMITS.max_repeat


def string(**bounds) -> dict:
    return {"type": "object", "properties": {"s": {"type": "string", **bounds}}, "required": ["s"]}


def array(**bounds) -> dict:
    return {"type": "array", "items": {"type": "integer"}, **bounds}


def pattern(regex: str) -> dict:
    return {"type": "string", "pattern": regex}


# -- JSON Schema: repeat counts --------------------------------------------------------------
@pytest.mark.parametrize(
    "schema",
    [
        string(maxLength=10**5),
        string(maxLength=2**31 - 1),
        string(minLength=10**5),
        string(minLength=2**31 - 1, maxLength=2**31 - 1),
        array(maxItems=10**5),
        array(minItems=10**5, maxItems=2**31 - 1),
        pattern("^a{100000}$"),
        pattern("^a{2147483647}$"),
        pattern("^a{5,2147483647}$"),
        pattern("^(ab){2147483647,}$"),
        pattern("^[{]x{2147483647}\\{9999999\\}$"),
    ],
    ids=lambda s: json.dumps(s)[-60:],
)
def test_counts_above_the_cap_are_unbounded_in_the_grammar(schema):
    fmt = parse_format(schema)
    # a grammar that spelled out the repeats would be millions of characters long
    assert len(fmt.grammar) < 40 * CAP
    assert fmt.schema == schema  # the output is still checked against the schema as sent


def test_counts_within_the_cap_stay_exact():
    exact, above = parse_format(string(maxLength=CAP)), parse_format(string(maxLength=CAP + 1))
    assert len(exact.grammar) > len(above.grammar)  # a bounded repeat against an open one
    bounded = bounded_schema(string(minLength=2**40, maxLength=2**41))
    assert bounded["properties"]["s"] == {"type": "string", "minLength": CAP}


@pytest.mark.parametrize(
    ("regex", "text"), [("^a}$", "a}"), ("^a]$", "a]"), ("^\\{9}$", "{9}"), ("^(a{2}})$", "aa}")]
)
def test_lone_closing_brackets_in_patterns_are_literals(demo_gguf, regex, text):
    # llama_cpp's converter looped forever on these; ours reads them as re does
    import re

    from grammar_probe import GrammarProbe

    assert re.fullmatch(regex.strip("^$"), text)
    probe = GrammarProbe(demo_gguf)
    try:
        assert probe.accepts(parse_format(pattern(regex)).grammar, json.dumps(text))
    finally:
        probe.close()


def test_pattern_rewrite_leaves_escapes_and_classes_alone():
    bounded = bounded_schema(pattern(r"^\{99999\}[{]{5}a{2,99999}(b){3}$"))
    assert bounded["pattern"] == r"^\{99999\}[{]{5}a{2,}(b){3}$"


@pytest.mark.parametrize(
    ("schema", "limit"),
    [
        ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(900)}},
         "properties"),
        ({"anyOf": [string(maxLength=CAP) for _ in range(LIMITS.repeat_budget // CAP + 1)]},
         "repeat"),
        (json.loads('{"items": ' * 80 + "{}" + "}" * 80), "deep"),
        ({"enum": list(range(LIMITS.max_nodes + 1))}, "values"),
        ({"enum": ["x" * (LIMITS.max_bytes + 1)]}, "bytes"),
        (pattern("a" * (LIMITS.max_pattern + 1)), "pattern"),
    ],
    ids=["optional properties", "repeat budget", "depth", "nodes", "bytes", "pattern length"],
)  # fmt: skip
def test_oversized_schemas_are_refused_naming_the_limit(schema, limit):
    with pytest.raises(InvalidRequest, match=f"invalid format: .*{limit}"):
        parse_format(schema)


# -- JSON Schema through the server ------------------------------------------------------------
SLOW_BEFORE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(900)}}


@pytest.mark.parametrize(
    "schema", [ATTACK, SLOW_BEFORE], ids=["exact attack", "900 optional properties"]
)
async def test_schema_attack_leaves_other_clients_answered(
    jp_fetch, jp_serverapp, jp_base_url, http_server_port, installed_model, schema
):
    body = {
        "model": "tiny",
        "prompt": "hi",
        "stream": False,
        "format": schema,
        "options": {"num_predict": 4},
    }

    async def attack() -> tuple[int, dict]:
        try:
            r = await jp_fetch("llm", "api", "generate", method="POST", body=json.dumps(body))
        except HTTPClientError as e:
            return e.code, json.loads(e.response.body)
        return r.code, json.loads(r.body)

    other = AsyncHTTPClient(force_instance=True)
    url = f"http://127.0.0.1:{http_server_port[1]}{jp_base_url}llm/api/tags"
    auth = {"Authorization": f"token {jp_serverapp.identity_provider.token}"}
    attacking = asyncio.ensure_future(attack())
    try:
        await asyncio.sleep(0)  # the attack request is on its way
        tags = await asyncio.wait_for(other.fetch(url, headers=auth), 1.0)
        assert tags.code == 200
    finally:
        status, answer = await attacking
        other.close()
    assert status in (200, 400), answer
    if status == 400:
        assert answer["error"].startswith("invalid format: "), answer


# -- Go templates ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{{" * 100_000, "unclosed {{"),
        ("x {{ " + " " * 100_000, "unclosed {{"),
        ("{{ if .System }}" * 100_000, "nested"),
        ("{{ if .System }}" * 5000 + "x" + "{{ end }}" * 5000, "nested"),
        ("{{-" * 50_000 + "}}", "not supported"),
    ],
    ids=["many {{", "{{ and spaces", "many ifs", "deep ifs", "many trims"],
)
def test_pathological_templates_are_refused(template, message):
    with pytest.raises(InvalidRequest, match=message):
        render_go_template(template, {"System": "s", "Prompt": "p"})


def test_a_template_may_not_render_past_its_limit():
    values = {"System": "", "Prompt": "x" * 10}
    assert len(render_go_template("{{ .Prompt }}" * 4, values, limit=40)) == 40
    with pytest.raises(InvalidRequest, match="template_render"):
        render_go_template("{{ .Prompt }}" * 4, values, limit=39)
    # a branch not taken costs nothing
    untaken = "{{ if .System }}" + "{{ .Prompt }}" * 8 + "{{ else }}-{{ end }}"
    assert render_go_template(untaken, values, limit=1) == "-"
    # a 1 MiB prompt written 40 times in a 440-byte template: 40 MiB is refused
    with pytest.raises(InvalidRequest, match=r"limit is 33,554,432 bytes \(template_render\)"):
        render_go_template("{{ .Prompt }}" * 40, {"Prompt": "x" * (1 << 20)})
    # counted in UTF-8: 1 Mi emoji (4 MiB) written 8 times is 32 MiB of text, past it
    emoji = {"Prompt": "\N{GRINNING FACE}" * (1 << 20)}
    with pytest.raises(InvalidRequest, match="template_render"):
        render_go_template("{{ .Prompt }}" * 8 + "!", emoji)
    assert len(render_go_template("{{ .Prompt }}", emoji, limit=4 << 20)) == 1 << 20


def test_templates_still_render():
    template = "{{- if .System }}[{{ .System }}] {{ end -}}\n Q: {{ .Prompt }} {{ else }}"
    with pytest.raises(InvalidRequest, match="unmatched"):
        render_go_template(template, {"System": "s", "Prompt": "p"})
    template = "{{- if .System }}[{{ .System }}]{{ else }}none{{ end }}  {{- .Prompt -}}  A:"
    assert render_go_template(template, {"System": "s", "Prompt": "p"}) == "[s]pA:"
    assert render_go_template(template, {"System": "", "Prompt": "p"}) == "nonepA:"
    assert render_go_template("a {x} }} b", {}) == "a {x} }} b"


# -- JSON bodies: NaN, Infinity, nesting -------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"options": {"temperature": NaN}}', "options.temperature: NaN"),
        (b'{"options": {"temperature": Infinity}}', "options.temperature: Infinity"),
        (b'{"keep_alive": -Infinity}', "keep_alive: -Infinity"),
        (b'{"messages": [{"role": "user", "content": NaN}]}', "messages[0].content: NaN"),
        (b"[" * 100_000 + b"]" * 100_000, "json_depth"),
        (b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, "json_depth"),
    ],
    ids=["NaN", "Infinity", "-Infinity", "in a list", "deep list", "deep object"],
)
def test_non_standard_json_is_refused(raw, message):
    with pytest.raises(InvalidRequest, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_json_object(raw)


async def test_nan_and_infinity_through_the_server(jp_fetch, installed_model):
    for raw, field in [
        ('{"model": "tiny", "prompt": "x", "options": {"temperature": NaN}}', "temperature"),
        ('{"model": "tiny", "prompt": "x", "options": {"temperature": 1e400}}', "temperature"),
        ('{"model": "tiny", "prompt": "x", "options": {"top_k": 1e400}}', "top_k"),
        ('{"model": "tiny", "prompt": "x", "options": {"seed": 1' + "0" * 400 + "}}", "seed"),
        ('{"model": "tiny", "prompt": "x", "keep_alive": NaN}', "keep_alive"),
        ("[" * 50_000 + "]" * 50_000, "json_depth"),
    ]:
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("llm", "api", "generate", method="POST", body=raw)
        assert info.value.code == 400, raw[:80]
        assert field in json.loads(info.value.response.body)["error"], raw[:80]


# -- options -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("temperature", math.inf),
        ("temperature", -math.inf),
        ("temperature", math.nan),
        ("temperature", 10**400),
        ("top_p", math.inf),
        ("seed", 2**63),
        ("num_predict", -(2**63) - 1),
        ("mirostat_tau", math.inf),
    ],
)
def test_options_refuse_infinite_and_huge_numbers(name, value):
    with pytest.raises(ValueError, match=f"options.{name}"):
        parse_options({name: value})


def test_options_keep_ordinary_numbers():
    assert parse_options({"seed": 2**63 - 1, "temperature": 1e300, "num_predict": -2}) == {
        "seed": 2**63 - 1,
        "temperature": 1e300,
        "num_predict": -2,
    }


# -- keep_alive --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value", [1e300, 10**400, "1e300", "99999999999999999h", 3.2e9, math.inf, "inf", -1e300]
)
def test_durations_beyond_a_century_are_forever(value):
    assert parse_duration(value) == FOREVER


def test_durations_within_a_century_stay():
    assert parse_duration(3e9) == 3e9  # 95 years


async def test_huge_keep_alive_leaves_ps_answering(jp_fetch, installed_model):
    body = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
    for keep_alive in (1e300, "1e300", 10**400):
        r = await jp_fetch(
            "llm",
            "api",
            "generate",
            method="POST",
            body=json.dumps({**body, "keep_alive": keep_alive}),
        )
        assert r.code == 200
        ps = await jp_fetch("llm", "api", "ps")
        assert ps.code == 200
        (model,) = json.loads(ps.body)["models"]
        assert model["expires_at"].startswith("2318-")  # Ollama's "forever"
    await jp_fetch(
        "llm", "api", "generate", method="POST", body=json.dumps({"model": "tiny", "keep_alive": 0})
    )


# -- model names -------------------------------------------------------------------------------
CONTROL_NAMES = [
    "a\nb",
    "x\u0000",
    "\u001b[2J",
    "a\n:latest",
    "tiny\n",
    "\ntiny",
    "tiny:latest\n",
    "host.example\n/ns/name",
    "ns\n/name",
    "tiny\r",
    "ti\tny",
    "tiny\x7f",
    "tiny\x85",
]


@pytest.mark.parametrize("text", CONTROL_NAMES, ids=ascii)
def test_names_with_control_characters_are_refused(text):
    with pytest.raises(InvalidRequest, match="control character"):
        parse_model_name(text)


async def test_names_with_control_characters_through_the_server(jp_fetch):
    for name in CONTROL_NAMES:
        with pytest.raises(HTTPClientError) as info:
            body = json.dumps({"model": name, "prompt": "x"})
            await jp_fetch("llm", "api", "generate", method="POST", body=body)
        assert info.value.code == 400, ascii(name)
        assert "model" in json.loads(info.value.response.body)["error"]


# -- model parameters from manifests -------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "kept", "dropped"),
    [
        ({"temperature": 0.7, "stop": ["<|end|>"], "num_ctx": 4096}, None, []),
        ({"num_ctx": 1e12}, {}, ["num_ctx"]),
        ({"temperature": "hot"}, {}, ["temperature"]),
        ({"bogus": 1, "top_k": 20}, {"top_k": 20}, ["bogus"]),
        ({"num_ctx": 4096.0, "seed": 3.0}, {"num_ctx": 4096, "seed": 3}, []),
        ({"num_ctx": 4096.5}, {}, ["num_ctx"]),
        ({"temperature": math.nan, "top_p": math.inf}, {}, ["temperature", "top_p"]),
        ({"stop": [1, 2]}, {}, ["stop"]),
        ({"stop": "x"}, {"stop": ["x"]}, []),
        ({"use_mmap": "yes", "num_gpu": True}, {}, ["use_mmap", "num_gpu"]),
        ({"temperature": None}, {}, []),
        ({"num_predict": 10**30}, {}, ["num_predict"]),
        ("not an object", {}, ["parameters"]),
        ([["temperature", 1]], {}, ["parameters"]),
    ],
)
def test_model_params_drop_what_requests_would_refuse(caplog, params, kept, dropped):
    with caplog.at_level(logging.WARNING, logger="jupyter_llm.request.options"):
        result = model_params(params, "hostile:latest")
    assert result == (params if kept is None else kept)
    warned = " ".join(r.getMessage() for r in caplog.records)
    for name in dropped:
        assert name in warned and "hostile:latest" in warned, warned
    if not dropped:
        assert not caplog.records


def test_model_params_sit_beneath_request_options_with_the_same_checks():
    params = model_params({"temperature": 0.5, "num_ctx": 2048}, "m")
    assert {**params, **parse_options({"temperature": 0.1})} == {
        "temperature": 0.1,
        "num_ctx": 2048,
    }
    with pytest.raises(ValueError):
        check_option(
            "options.temperature",
            parse_options.__globals__["OPTION_TYPES"]["temperature"],
            math.inf,
        )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("PARAMETER num_ctx 99999999999", "line 2: PARAMETER num_ctx"),
        ("PARAMETER temperature nan", "line 2: PARAMETER temperature"),
        ("PARAMETER temperature inf", "line 2: PARAMETER temperature"),
        ("PARAMETER top_p 2", "line 2: PARAMETER top_p"),
    ],
)
def test_modelfile_parameters_are_checked_like_requests(line, message):
    from jupyter_llm.models.modelfile import parse_modelfile

    with pytest.raises(InvalidRequest, match=message):
        parse_modelfile(f"FROM tiny\n{line}\n")


# -- Jinja2 ------------------------------------------------------------------------------------
def test_the_package_requires_a_jinja2_without_the_known_sandbox_escapes():
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (jinja,) = [
        Requirement(r)
        for r in pyproject["project"]["dependencies"]
        if Requirement(r).name.lower() == "jinja2"
    ]
    assert "3.1.5" not in jinja.specifier and "3.1.6" in jinja.specifier


def test_jinja2_is_a_release_without_the_known_sandbox_escapes():
    import jinja2
    from packaging.version import Version

    assert Version(jinja2.__version__) >= Version("3.1.6")


ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ ('{0.__class__.__mro__}' | attr('format'))(1) }}",  # CVE-2025-27516
    "{% set f = '{0.__class__.__init__.__globals__}'.format %}{{ f(1) }}",  # CVE-2024-56326
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__ }}",
]


def llama_cpp_formatter(template: str) -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    formatter = Jinja2ChatFormatter(template=template, eos_token="</s>", bos_token="<s>")
    assert isinstance(formatter._environment.environment, ImmutableSandboxedEnvironment)
    return formatter(messages=[{"role": "user", "content": "hi"}]).prompt


def runner_template(template: str) -> str:
    """What the runner renders GGUF chat templates with (the same sandbox, bounded)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from jupyter_llm.runner.chat_template import ChatTemplate, _environment
    from jupyter_llm.runner.protocol import InputError

    assert isinstance(_environment(), ImmutableSandboxedEnvironment)
    try:
        return ChatTemplate(template, "<s>", "</s>").render([{"role": "user", "content": "hi"}])
    except InputError as e:  # a template error is the request's 400; keep what it was
        raise e.__cause__ or e from None


@pytest.mark.parametrize("render", [llama_cpp_formatter, runner_template])
@pytest.mark.parametrize("template", ESCAPES)
def test_chat_templates_cannot_leave_the_sandbox(template, render):
    from jinja2.exceptions import SecurityError, UndefinedError

    try:
        prompt = render(template)
    except (SecurityError, UndefinedError):
        return
    for leak in ("<class", "<function", "<module", "subprocess", "uid="):
        assert leak not in prompt, prompt
