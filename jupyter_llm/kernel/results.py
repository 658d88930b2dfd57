"""What the magic returns: a ``Generation`` (text, parsed data, metrics) with
rich reprs, and ``Chat``, the history a ``--chat NAME`` conversation keeps.

The Markdown reprs show model text through ``safe_markdown`` (it may carry
HTML a prompt injection asked for); ``text/plain`` is the text as generated."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any

from jupyter_llm.kernel.markdown import safe_markdown


@dataclass
class Metrics:
    model: str
    eval_count: int = 0
    eval_duration_ns: int = 0
    prompt_eval_count: int = 0
    load_duration_ns: int = 0
    total_duration_ns: int = 0
    done_reason: str = ""
    draft_tokens: int = 0  # speculative decoding: tokens drafted...
    draft_accepted: int = 0  # ...and confirmed by the model

    @property
    def tokens_per_second(self) -> float:
        return self.eval_count / (self.eval_duration_ns / 1e9) if self.eval_duration_ns else 0.0

    @classmethod
    def from_final(cls, model: str, final: dict[str, Any]) -> Metrics:
        return cls(
            model=model,
            eval_count=final.get("eval_count", 0),
            eval_duration_ns=final.get("eval_duration", 0),
            prompt_eval_count=final.get("prompt_eval_count", 0),
            load_duration_ns=final.get("load_duration", 0),
            total_duration_ns=final.get("total_duration", 0),
            done_reason=final.get("done_reason", ""),
            draft_tokens=final.get("draft_tokens", 0),
            draft_accepted=final.get("draft_accepted", 0),
        )

    def footer(self) -> str:
        parts = [self.model, f"{self.eval_count} tokens", f"{self.tokens_per_second:.1f} tok/s"]
        if self.draft_tokens:
            parts.append(f"{self.draft_accepted}/{self.draft_tokens} drafts accepted")
        if self.load_duration_ns > 1e6:
            parts.append(f"load {self.load_duration_ns / 1e9:.2f} s")
        if self.done_reason in ("length", "cancel"):
            parts.append(
                {"length": "stopped at the token limit", "cancel": "interrupted"}[self.done_reason]
            )
        return " · ".join(parts)


@dataclass
class Generation:
    text: str
    metrics: Metrics
    data: Any = None  # the parsed (and validated) output when a format was given

    def __str__(self) -> str:
        return self.text

    def _repr_markdown_(self) -> str:
        body = self.text
        if self.data is not None:
            body = f"```json\n{json.dumps(_plain(self.data), indent=2)}\n```"
        return f"{safe_markdown(body)}\n\n<sub>{html.escape(self.metrics.footer())}</sub>"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {
            "text/markdown": self._repr_markdown_(),
            "text/plain": f"{self.text}\n[{self.metrics.footer()}]",
        }


@dataclass
class Chat:
    """A conversation kept between ``%%llm --chat NAME`` cells."""

    model: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)

    def _repr_markdown_(self) -> str:
        lines = [
            f"**{html.escape(str(m['role']))}**\n\n{safe_markdown(str(m['content']))}"
            for m in self.messages
        ]
        return "\n\n".join(lines) or "*(empty chat)*"

    def clear(self) -> None:
        self.messages.clear()


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    return value
