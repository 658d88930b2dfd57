"""Every bound on what one request may ask of the server, in one table.

The server is shared: a Hub engine or a team's lab server runs every user's
requests in the same runners and on the same event loop. Each dimension a
client controls (a count, a length, a depth, pixels, tokens) is bounded
here, once, with the reason the bound serves real users (the peer's own limit
where one exists). The parsers of both APIs, the runner and the README's
Security table read these values; nothing else spells a bound out.

Going over a limit is a ``ValueError`` from ``Limit.exceeded``, whose message
names the field as the client wrote it and the limit by value and key; the
API edge turns it into a 400. ``OPTION_BOUNDS`` says, for every Ollama
option, what bounds it, so a new option without a bound fails a test.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """One bounded dimension of a request."""

    key: str  # short and stable: in error messages, the README and tests
    fields: str  # what it bounds, as a client writes it
    value: int
    unit: str  # what ``value`` counts ("strings", "levels", "pixels")
    why: str  # why this value serves real users (a peer's limit where one exists)
    shown: str = ""  # the value and unit as the README shows them, where not a plain number

    def exceeded(self, field: str, got: int | None = None) -> ValueError:
        """The error for ``field`` going over this limit (``got``: by how much)."""
        has = f" has {got:,} {self.unit};" if got is not None else " is over its limit;"
        return ValueError(f"{field}{has} the limit is {self.value:,} {self.unit} ({self.key})")

    def check(self, field: str, got: int) -> None:
        if got > self.value:
            raise self.exceeded(field, got)


MiB = 1 << 20

# -- bodies ---------------------------------------------------------------------------------
BODY_BYTES = Limit(
    "body_bytes",
    "a JSON request body",
    32 * MiB,
    "bytes",
    "far above any prompt (a 1M-token context is about 4 MiB of text), with room for "
    "20 MiB images; larger bodies are refused before they are held in memory",
    shown="32 MiB",
)
BODIES_HELD = Limit(
    "bodies_held",
    "request bodies one user has in the server at once (queued prompts and uploads not yet ended)",
    256 * MiB,
    "bytes",
    "eight bodies at body_bytes; a queued request keeps its body until it runs, and one "
    "user may hold most of the queue's places: 16 queued 32 MiB prompts held 1 GiB",
    shown="256 MiB",
)
BODY_DEPTH = Limit(
    "json_depth",
    "nesting of arrays and objects in a request body",
    100,
    "levels",
    "messages, tool calls and their arguments need under 10 levels beside the "
    "arguments' own 64; Python's parser would fail near 1000 with a 500",
)
JSON_VALUES = Limit(
    "json_values",
    "values (strings, numbers, objects, arrays) in a request body",
    1 << 18,
    "values",
    "chats of thousands of messages and 2,048 embedding inputs hold tens of thousands; "
    "Ollama's old context (token ids) fits up to 256k tokens. Decoding a body in the "
    "server holds its GIL, about 25 ms at this limit",
    shown="256 Ki (262,144) values",
)
DECODE_ON_LOOP_BYTES = 64 << 10  # bodies above this are parsed off the event loop

TEXT_LAYER = Limit(
    "text_layer",
    "template, system, license, messages (/api/create; each, as UTF-8; messages as JSON)",
    4 * MiB,
    "bytes",
    "Ollama's store keeps each as a layer; real chat templates are under 20 KiB",
    shown="4 MiB",
)
LICENSES = Limit(
    "licenses",
    "license as a list (/api/create)",
    16,
    "licenses",
    "a model carries one license, at times its base's too; each is a layer the store "
    "writes and hashes while it holds the store's lock",
)
TEMPLATE_RENDER = Limit(
    "template_render",
    "the prompt a request's template renders (/api/generate)",
    BODY_BYTES.value,
    "bytes",
    "as long as a prompt a body can carry, in UTF-8 (counted in characters, 1 Mi "
    "emoji rendered 32 times held 485 MiB); {{ .Prompt }} written many times would "
    "otherwise turn a 1 MiB body into gigabytes in the server",
    shown="32 MiB",
)

# -- sampling -------------------------------------------------------------------------------
STOP_STRINGS = Limit(
    "stop_strings",
    "options.stop, stop, stop_sequences",
    64,
    "strings",
    "each is checked after every token in the loop all users share; OpenAI allows 4, "
    "clients send a handful",
)
STOP_CHARS = Limit(
    "stop_chars",
    "options.stop, stop, stop_sequences (all strings together)",
    16384,
    "characters",
    "the text held back while a stop may still match grows with the longest stop",
)
REPEAT_LAST_N = Limit(
    "repeat_last_n",
    "options.repeat_last_n",
    1 << 20,
    "tokens",
    "llama.cpp allocates a penalty window of this many tokens per slot; a window past "
    "the context sees nothing more. -1 means num_ctx, as in Ollama",
    shown="num_ctx (-1: num_ctx)",
)
DRAFT_TOKENS = Limit(
    "draft_num_predict",
    "options.draft_num_predict",
    16,
    "tokens",
    "the starting draft length; each drafted token costs a logit row and a cell per "
    "step, and a sequence's drafts grow to this cap only while accepted whole",
)
PREDICT_CONTEXTS = Limit(
    "predict_contexts",
    "tokens in an answer: options.num_predict, and -1 (the default: until a stop)",
    10,
    "contexts",
    "an answer shifting past the context's end has no end of its own when the model never "
    "stops, a whole answer is held in memory until done, and a stream holds its slot; a "
    'larger num_predict or -1 ends with "length" here, as Ollama\'s does',
    shown="10 x num_ctx tokens",
)
DRAFT_LOOKUP = Limit(
    "draft_lookup",
    "the prompt tokens searched for drafts",
    8192,
    "tokens",
    "the lookup's index of token pairs is built in Python when a sequence starts "
    "generating; the last 8,192 prompt tokens hold what an answer quotes, at a few "
    "milliseconds of work",
)
TOP_LOGPROBS = Limit(
    "top_logprobs",
    "top_logprobs, logprobs (/v1/completions)",
    20,
    "alternatives",
    "OpenAI's and Ollama's bound",
)
WHOLE_LOGPROBS = Limit(
    "whole_logprobs",
    "log-probabilities one answer not streamed holds: each token and each of its "
    "top_logprobs count one",
    1 << 18,
    "entries",
    "the server holds a whole answer's log-probabilities until it ends, 400 to 670 bytes "
    "each as Python holds them (an answer of 10 32k contexts at top_logprobs 20 was 2.8 GB); "
    'past this the answer ends with "length": 12,483 tokens at top_logprobs 20, 262,144 '
    "with none. A stream holds none: stream to go further",
    shown="256 Ki entries",
)

# -- images ---------------------------------------------------------------------------------
IMAGES = Limit(
    "images",
    "images, messages[].images, image_url parts (all together, the model's MESSAGE images too)",
    32,
    "images",
    "several pages or frames per request; each costs hundreds of context tokens",
)
IMAGE_BYTES = Limit(
    "image_bytes",
    "one image file",
    20 * MiB,
    "bytes",
    "OpenAI's per-image size limit",
    shown="20 MiB",
)
IMAGE_SIDE = Limit(
    "image_side",
    "one image's width or height, read from its header",
    8000,
    "pixels",
    "Anthropic's bound; vision encoders resize to under 2000 pixels anyway",
)
IMAGE_PIXELS = Limit(
    "image_pixels",
    "one image's width x height, read from its header before anything is decoded",
    32 * MiB,
    "pixels",
    "a 24-megapixel photo and 8K video frames fit; decoding one takes at most 96 MiB "
    "in the runner, and a 1-bit 12288x12288 PNG of 17 KB no longer becomes 450 MB",
    shown="32 Mi (33,554,432) pixels",
)
REQUEST_PIXELS = Limit(
    "request_pixels",
    "all images of a request together",
    64 * MiB,
    "pixels",
    "two of the largest images, or 32 ordinary photos of 2 megapixels",
    shown="64 Mi (67,108,864) pixels",
)

# -- embeddings -----------------------------------------------------------------------------
EMBED_INPUTS = Limit(
    "embed_inputs",
    "input (/api/embed, /v1/embeddings)",
    2048,
    "inputs",
    "OpenAI's bound per embeddings request",
)
EMBED_TOKENS = Limit(
    "embed_tokens",
    "input, all inputs together after tokenizing",
    300_000,
    "tokens",
    "OpenAI's bound per embeddings request; the work runs in chunks between decode steps",
)
EMBED_CHUNK_TOKENS = 512  # tokens embedded between two decode steps (one ubatch)

# -- structured output and tools ------------------------------------------------------------
SCHEMA_BYTES = Limit(
    "schema_bytes",
    "format, response_format, tools[].function.parameters (each, as JSON)",
    256 << 10,
    "bytes",
    "pydantic models of hundreds of fields are a few KiB",
    shown="256 KiB",
)
SCHEMA_NODES = Limit(
    "schema_nodes",
    "format, response_format, tools[].function.parameters: values in the schema",
    10_000,
    "values",
    "OpenAI allows 5000 properties in all",
)
SCHEMA_DEPTH = Limit(
    "schema_depth",
    "nesting in a schema and of groups in its patterns, and in tool-call arguments",
    64,
    "levels",
    "OpenAI allows 10 levels of objects; 64 leaves room for $defs and anyOf",
)
SCHEMA_REPEATS = Limit(
    "schema_repeats",
    "format, response_format, tools[].function.parameters: minLength, maxLength, "
    "minItems, maxItems and {m,n} in patterns, as the grammar spells them out (all together)",
    50_000,
    "repeats",
    "llama.cpp expands a counted repeat into that many rules when it parses the grammar; "
    "a count above SCHEMA_REPEAT_CAP is not spelled out (the output is still validated)",
)
SCHEMA_REPEAT_CAP = 1000  # a count above this is left open in the grammar, not refused
SCHEMA_OPTIONAL = Limit(
    "schema_optional",
    "optional properties of one object in a schema (those not in required)",
    256,
    "properties",
    "llama-cpp-python's converter refused more (its rules grew with their square); "
    "pydantic models list their fields as required",
)
SCHEMA_PATTERN = Limit(
    "schema_pattern",
    "one pattern in a schema",
    4096,
    "characters",
    "identifiers, dates and codes are under 200; the grammar grows with the pattern",
)
ENUM_VALUES = Limit(
    "enum_values",
    "enum and const values in one schema (all enums together)",
    1000,
    "values",
    "OpenAI's bound for structured outputs",
)
ENUM_CHARS = Limit(
    "enum_chars",
    "characters of all enum and const values in one schema (other than strings: as JSON)",
    15_000,
    "characters",
    "OpenAI's bound for large enums; the grammar builds enums as a prefix tree",
)
SCHEMA_ALTERNATIVES = Limit(
    "schema_alternatives",
    "anyOf, oneOf and type-list branches in one schema (all together)",
    256,
    "branches",
    "the grammar sampler tracks a stack per live branch, for every token; pydantic "
    "unions have a few",
)
OUTPUT_CHECK_CPU = Limit(
    "output_check_cpu",
    "checking one structured answer against its schema (format, response_format)",
    1,
    "s of CPU",
    "a real answer checks in milliseconds; a schema's pattern can make Python's regular "
    "expressions backtrack for hours on a model's output. The check runs in a helper "
    "process after the answer went out; past this, the log says it was not checked",
    shown="1 s of CPU",
)
TOOLS = Limit(
    "tools",
    "tools",
    128,
    "tools",
    "OpenAI's bound",
)

# -- Anthropic's Messages API (/v1/messages) ---------------------------------------------------
CONTENT_BLOCKS = Limit(
    "content_blocks",
    "system blocks, messages[].content blocks and tool_result content blocks "
    "(/v1/messages; all together)",
    16384,
    "blocks",
    "a long agent session holds a few thousand (a text, tool_use and tool_result block "
    "per step); each block is one more message or part for the chat template",
)
SYSTEM_BYTES = Limit(
    "system_bytes",
    "system (/v1/messages; all its text blocks together, as UTF-8)",
    4 * MiB,
    "bytes",
    "as a model's system layer (text_layer); coding agents' system prompts are under 100 KiB",
    shown="4 MiB",
)
TOOL_NAME = Limit(
    "tool_name",
    "tools[].function.name; tools[].name, tool_choice.name, tool_use.name (/v1/messages)",
    128,
    "characters",
    "names are identifiers; MCP tools' names, prefixed with their server's, stay well "
    "under it. Each name is spelled out in the tool-call grammar",
)

# -- OpenAI's Responses API (/v1/responses) -------------------------------------------------
INPUT_ITEMS = Limit(
    "input_items",
    "input items and their content parts (/v1/responses; all together)",
    16384,
    "items",
    "as content_blocks: a long agent session sends back a few thousand messages, "
    "function calls and their outputs; each is one more message or part for the template",
)
INSTRUCTIONS_BYTES = Limit(
    "instructions_bytes",
    "instructions (/v1/responses, as UTF-8)",
    4 * MiB,
    "bytes",
    "as system_bytes: agents' instructions are under 100 KiB",
    shown="4 MiB",
)
RESPONSE_ID = Limit(
    "response_id",
    "previous_response_id, input[].call_id, tool names (/v1/responses)",
    128,
    "characters",
    "ids this server writes are under 40 characters; clients' call ids and tool names "
    "are identifiers",
)
METADATA_KEYS = Limit(
    "metadata_keys",
    "metadata (/v1/responses): pairs, each key up to 64 and value up to 512 characters",
    16,
    "pairs",
    "OpenAI's bounds; the pairs are echoed in the response",
)
STORED_RESPONSES = Limit(
    "stored_responses",
    "responses kept for previous_response_id, per user (store: true)",
    64,
    "responses",
    "an agent continues from its last response; older ones are dropped first",
)
STORED_BYTES = Limit(
    "stored_bytes",
    "the conversations kept for previous_response_id, all users together (as JSON)",
    256 * MiB,
    "bytes",
    "held in the server's memory: the oldest of the user holding the most are dropped "
    "first to stay under it",
    shown="256 MiB",
)
CONVERSATION_BYTES = Limit(
    "conversation_bytes",
    "a conversation continued by previous_response_id, with the new input (/v1/responses; as JSON)",
    BODY_BYTES.value,
    "bytes",
    "as much as one body may carry: a chain of responses would otherwise send a runner up "
    "to the whole store (stored_bytes) in one request",
    shown="32 MiB",
)
STORED_SECONDS = Limit(
    "stored_seconds",
    "how long a stored response stays usable as previous_response_id",
    3600,
    "seconds",
    "long enough for an agent's session between two calls; nothing is kept on disk",
    shown="1 hour",
)
ORIGIN_CHARS = Limit(
    "origin_chars",
    "X-LLM-Kernel and X-LLM-Cell headers, and /api/usage's kernel and user (each; "
    "letters, digits and - _ . : @ only)",
    64,
    "characters",
    "kernel ids are 36-character UUIDs and nbformat cell ids are at most 64 characters; "
    "the values are kept in the usage table and shown back in notebooks",
)
USAGE_KERNELS = Limit(
    "usage_kernels",
    "kernels (and other clients) whose usage the server keeps, all users together",
    256,
    "kernels",
    "a team server runs tens of kernels at once; the least recently active is dropped first",
)
USAGE_USER_KERNELS = Limit(
    "usage_user_kernels",
    "kernels (and other clients) whose usage the server keeps for one user",
    32,
    "kernels",
    "a user runs a few notebooks at once; past it that user's least recently active kernel "
    "is dropped, so one user naming new kernels cannot push other users' rows out",
)
USAGE_CELLS = Limit(
    "usage_cells",
    "cells whose usage the server keeps, per kernel",
    128,
    "cells",
    "a long notebook has about a hundred cells that call a model; the least recently "
    "active is dropped first (its kernel's and user's totals keep its counts)",
)
USAGE_USERS = Limit(
    "usage_users",
    "users whose totals the server keeps",
    1024,
    "users",
    "a Hub of a thousand users; the least recently active user's totals are dropped first",
)
USAGE_MODELS = Limit(
    "usage_models",
    "models counted apart in one cell's or one user's usage",
    8,
    "models",
    "a cell calls one model, a user a handful; past it the least recently used model's "
    "row is dropped",
)
USAGE_ROWS = Limit(
    "usage_rows",
    "cell rows, and user rows, in one /api/usage answer (each; the most recently active first)",
    1000,
    "rows",
    "a notebook's table shows tens of cells; an admin asking for every kernel gets the "
    "newest rows without the event loop walking the whole table",
)
METRIC_LABEL_SETS = Limit(
    "metric_label_sets",
    "distinct label sets (model, user, route, outcome) of each Prometheus metric",
    1000,
    "label sets",
    "models are bounded by the store and users by the Hub, yet series live as long as the "
    "server: past this, new models and users are counted as `other`, so a scrape stays small",
)
HISTORY_SAMPLES = Limit(
    "history_samples",
    "samples the sidebar's history keeps (GET /api/history), one every 2 seconds",
    300,
    "samples",
    "ten minutes at the sampler's 2 s interval; the oldest drops out as a new one comes",
)
HISTORY_POINTS = Limit(
    "history_points",
    "points (GET /api/history?points=N), the samples merged into runs to fit",
    300,
    "points",
    "a sidebar chart is under 300 pixels wide; more points than samples are never sent",
)
HISTORY_MODELS = Limit(
    "history_models",
    "models per device, and models with a token rate, in one history sample",
    8,
    "models",
    "a chart tells apart a handful of colours; past it the smallest are summed as `other`",
)
HISTORY_DEVICES = Limit(
    "history_devices",
    "devices in one history sample",
    16,
    "devices",
    "a machine has at most 8 or 16 GPUs; on a cluster, those holding most memory are kept",
)
PS_REQUESTS = Limit(
    "ps_requests",
    "requests listed one by one per model in /api/ps (`requests`: running first, then queued)",
    64,
    "requests",
    "a model runs num_parallel (4 by default) at once and a glance at the queue needs its "
    "head; past it `requests_left_out` counts the rest, and `priorities` and `users` still "
    "count every request (the queue holds up to max_queue, 512 by default)",
)

# -- table ----------------------------------------------------------------------------------
TABLE: tuple[Limit, ...] = (
    BODY_BYTES,
    BODIES_HELD,
    DRAFT_TOKENS,
    DRAFT_LOOKUP,
    PREDICT_CONTEXTS,
    BODY_DEPTH,
    JSON_VALUES,
    TEXT_LAYER,
    LICENSES,
    TEMPLATE_RENDER,
    STOP_STRINGS,
    STOP_CHARS,
    REPEAT_LAST_N,
    TOP_LOGPROBS,
    WHOLE_LOGPROBS,
    IMAGES,
    IMAGE_BYTES,
    IMAGE_SIDE,
    IMAGE_PIXELS,
    REQUEST_PIXELS,
    EMBED_INPUTS,
    EMBED_TOKENS,
    SCHEMA_BYTES,
    SCHEMA_NODES,
    SCHEMA_DEPTH,
    SCHEMA_REPEATS,
    SCHEMA_OPTIONAL,
    SCHEMA_PATTERN,
    ENUM_VALUES,
    ENUM_CHARS,
    SCHEMA_ALTERNATIVES,
    OUTPUT_CHECK_CPU,
    TOOLS,
    CONTENT_BLOCKS,
    SYSTEM_BYTES,
    TOOL_NAME,
    INPUT_ITEMS,
    INSTRUCTIONS_BYTES,
    RESPONSE_ID,
    METADATA_KEYS,
    STORED_RESPONSES,
    STORED_BYTES,
    CONVERSATION_BYTES,
    STORED_SECONDS,
    ORIGIN_CHARS,
    USAGE_KERNELS,
    USAGE_USER_KERNELS,
    USAGE_CELLS,
    USAGE_USERS,
    USAGE_MODELS,
    USAGE_ROWS,
    METRIC_LABEL_SETS,
    HISTORY_SAMPLES,
    HISTORY_POINTS,
    HISTORY_MODELS,
    HISTORY_DEVICES,
    PS_REQUESTS,
)
BY_KEY = {limit.key: limit for limit in TABLE}

# What bounds each Ollama option (``options.OPTION_TYPES``): a limit above,
# or why its value costs nothing beyond arithmetic (its range is checked by
# the option table). A test fails for an option missing here.
SCALAR = "a number the sampler uses; no allocation or work grows with it"
LOAD = "a load option: the memory estimate and the fit check bound what it costs"
OPTION_BOUNDS: dict[str, Limit | str] = {
    "num_predict": "-1, and a count past predict_contexts (10 contexts), end there in "
    'the runner with "length" (as Ollama), not a 400: the cap depends on num_ctx; an '
    "answer not streamed with log-probabilities ends at whole_logprobs",
    "temperature": SCALAR,
    "seed": SCALAR,
    "top_k": "llama.cpp clamps it to the vocabulary",
    "top_p": SCALAR,
    "min_p": SCALAR,
    "typical_p": SCALAR,
    "repeat_penalty": SCALAR,
    "repeat_last_n": REPEAT_LAST_N,
    "presence_penalty": SCALAR,
    "frequency_penalty": SCALAR,
    "stop": STOP_STRINGS,
    "num_ctx": LOAD,
    "num_batch": LOAD,
    "num_thread": LOAD,
    "num_gpu": LOAD,
    "main_gpu": LOAD,
    "use_mmap": LOAD,
    "num_keep": "clamped to the context by the runner",
    "draft_num_predict": DRAFT_TOKENS,
    "tool_choice": "one of four words or a tool's name, checked against tools",
    "mirostat": SCALAR,
    "mirostat_tau": SCALAR,
    "mirostat_eta": SCALAR,
}


def whole_answer_tokens(top_logprobs: int) -> int:
    """The most tokens an answer not streamed may hold with ``top_logprobs``
    alternatives each (``WHOLE_LOGPROBS``)."""
    return WHOLE_LOGPROBS.value // (1 + top_logprobs)


def check_stops(stops: list[str], field: str) -> None:
    """Stop strings within ``STOP_STRINGS`` and ``STOP_CHARS``."""
    STOP_STRINGS.check(field, len(stops))
    STOP_CHARS.check(field, sum(len(s) for s in stops))


def repeat_window(repeat_last_n: int, num_ctx: int) -> int:
    """The penalty window llama.cpp gets: -1 is ``num_ctx``, as in Ollama; a
    window past the context is a ``ValueError`` naming both."""
    if repeat_last_n == -1:
        return num_ctx
    if repeat_last_n > num_ctx:
        raise ValueError(
            f"options.repeat_last_n is {repeat_last_n:,}, larger than the context "
            f"(num_ctx {num_ctx:,}); the limit is num_ctx (repeat_last_n), -1 means num_ctx"
        )
    return repeat_last_n
