"""Tool calls and thinking in the formats of the major open model families:
which format a model speaks (read from its chat template), the history in
the shape its template renders, and its output read back into content,
thinking and tool calls, finished or streamed.

Pure functions and small stream objects, free of I/O: the runner or the
API layer feeds them text.
"""

from jupyter_llm.chat_formats.bundled import read_template, template_names
from jupyter_llm.chat_formats.detect import (
    FALLBACK,
    ChatFormat,
    detect_format,
    prompt_opens_thinking,
    template_variables,
)
from jupyter_llm.chat_formats.history import ToolArguments, place_images, template_messages
from jupyter_llm.chat_formats.output import OutputDelta, OutputStream, ParsedOutput, parse_output
from jupyter_llm.chat_formats.thinking import (
    SplitOutput,
    ThinkingDelta,
    ThinkingStream,
    split_thinking,
)
from jupyter_llm.chat_formats.tool_calls import (
    ParsedToolCalls,
    ToolCall,
    ToolCallDelta,
    ToolCallStream,
    parse_tool_calls,
)

__all__ = [
    "FALLBACK",
    "ChatFormat",
    "OutputDelta",
    "OutputStream",
    "ParsedOutput",
    "ParsedToolCalls",
    "SplitOutput",
    "ThinkingDelta",
    "ThinkingStream",
    "ToolArguments",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "detect_format",
    "parse_output",
    "parse_tool_calls",
    "place_images",
    "prompt_opens_thinking",
    "read_template",
    "split_thinking",
    "template_messages",
    "template_names",
    "template_variables",
]
