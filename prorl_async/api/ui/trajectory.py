"""One result document as the trajectory page shows it: the prompt's messages, each
turn (assistant text and tool calls, tool observations), the stage timings and every
response token as one element.

Everything here is text from a rollout: untrusted. The token strip is built as one HTML
string (a 32k-token result is 32k elements: a template loop would take several times as
long), so each piece of it goes through ``html.escape``; the rest is escaped by the
templates' autoescaping.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html import escape
from typing import Any

from markupsafe import Markup

from prorl_async.llm.toolcalls import ToolCall, parse_tool_calls

__all__ = ["Message", "TrajectoryView", "build_view", "timing_bars"]

_CHATML = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)
_RESPONSE = re.compile(r"<tool_response>\n?(.*?)\n?</tool_response>", re.DOTALL)
_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)
# Colours cycle over a job's weight versions (CSS classes v0..v5).
_PALETTE = 6


@dataclass
class Call:
    name: str
    arguments: str
    error: str = ""


@dataclass
class Message:
    """One block of the conversation."""

    role: str
    text: str
    calls: list[Call] = field(default_factory=list)
    tokens: Markup | None = None
    count: int = 0
    versions: str = ""
    interrupted: bool = False


@dataclass
class TrajectoryView:
    prompt: list[Message]
    turns: list[Message]
    loose_tokens: Markup | None
    token_count: int
    versions: list[str]


def build_view(
    doc: dict[str, Any], prompt_text: str | None, texts: list[str] | None
) -> TrajectoryView:
    """The page's view of ``doc``; ``prompt_text`` the decoded prompt and ``texts`` each
    response token's text (None: the server has no tokenizer; ids are shown)."""
    ids: list[int] = doc.get("response_ids") or []
    versions = [str(v) for v in doc.get("weight_versions") or []]
    tokens = _Tokens(doc, texts, versions)
    turns = [_turn(t) for t in doc.get("turns") or []]
    _pair_observations(turns)
    spans = [len(t.get("token_ids") or []) for t in doc.get("turns") or []]
    loose = None
    if sum(spans) == len(ids):
        start = 0
        for msg, turn, n in zip(turns, doc.get("turns") or [], spans, strict=True):
            msg.tokens = tokens.html(start, start + n, turn.get("segments") or [])
            msg.count, start = n, start + n
    else:  # turns without their ids (a synthetic result): all tokens in one strip
        loose = tokens.html(0, len(ids), [])
    return TrajectoryView(
        prompt=_prompt(prompt_text),
        turns=turns,
        loose_tokens=loose,
        token_count=len(ids),
        versions=versions,
    )


def _prompt(text: str | None) -> list[Message]:
    if text is None:
        return []
    found = [Message(role=m.group(1), text=m.group(2).strip("\n")) for m in _CHATML.finditer(text)]
    found = [m for m in found if m.text or m.role != "assistant"]  # the open generation cue
    return found or [Message(role="prompt", text=text)]


def _turn(turn: dict[str, Any]) -> Message:
    role = str(turn.get("role", "?"))
    text = str(turn.get("text", ""))
    if role != "assistant":
        return Message(role=role, text=text)
    calls = [_call(c) for c in parse_tool_calls(text)]
    shown = _CALL_BLOCK.sub("", text).strip() if calls else text
    segments = turn.get("segments") or []
    versions = " → ".join(dict.fromkeys(_segment_versions(segments)))
    return Message(
        role=role,
        text=shown,
        calls=calls,
        versions=versions or str(turn.get("weight_version", "")),
        interrupted=len(segments) > 1 or any("weight_version_end" in s for s in segments),
    )


def _segment_versions(segments: list[dict[str, Any]]) -> list[str]:
    out = []
    for s in segments:
        out.append(str(s.get("weight_version")))
        if "weight_version_end" in s:
            out.append(str(s["weight_version_end"]))
    return out


def _call(call: Any) -> Call:
    if isinstance(call, ToolCall):
        return Call(
            name=call.name, arguments=json.dumps(call.arguments, indent=2, ensure_ascii=False)
        )
    return Call(name=call.name or "?", arguments=call.raw, error=call.error)


def _pair_observations(turns: list[Message]) -> None:
    """A tool turn shows each ``<tool_response>`` as its own observation, named by the
    call before it that it answers."""
    calls: list[Call] = []
    for msg in turns:
        if msg.role == "assistant":
            calls = msg.calls
            continue
        responses = _RESPONSE.findall(msg.text)
        if msg.role == "tool" and responses:
            msg.calls = [
                Call(name=calls[i].name if i < len(calls) else "?", arguments=r)
                for i, r in enumerate(responses)
            ]


class _Tokens:
    """The response tokens as elements: ``data-mask``, ``data-version`` (empty for an
    observation token) and a ``title`` with the id and logprob."""

    def __init__(self, doc: dict[str, Any], texts: list[str] | None, versions: list[str]) -> None:
        self.ids: list[int] = doc.get("response_ids") or []
        n = len(self.ids)
        self.mask: list[int] = _fit(doc.get("response_mask"), n, 1)
        self.logprobs: list[float] = _fit(doc.get("response_logprobs"), n, 0.0)
        self.versions: list[Any] = _fit(doc.get("response_versions"), n, None)
        self.texts = (
            texts if texts is not None and len(texts) == n else [f"[{i}]" for i in self.ids]
        )
        self.colour = {v: f"v{i % _PALETTE}" for i, v in enumerate(versions)}

    def html(self, start: int, end: int, segments: list[dict[str, Any]]) -> Markup:
        breaks = _breaks(segments, start)
        parts = []
        for k in range(start, end):
            mark = breaks.get(k)
            if mark is not None:
                parts.append(mark)
            parts.append(self._one(k))
        return Markup("".join(parts))

    def _one(self, k: int) -> str:
        version = self.versions[k]
        v = "" if version is None else escape(str(version))
        cls = "t obs" if not self.mask[k] else f"t {self.colour.get(str(version), 'v0')}"
        title = f"id {self.ids[k]} · logprob {self.logprobs[k]:.4f}"
        return (
            f'<span class="{cls}" data-mask="{self.mask[k]}" data-version="{v}" '
            f'title="{escape(title)}">{escape(self.texts[k])}</span>'
        )


def _breaks(segments: list[dict[str, Any]], offset: int) -> dict[int, str]:
    """Markers where a turn's weights changed: before each segment after the first, and
    inside a ``keep`` segment whose boundary the engine could not report."""
    marks: dict[int, str] = {}
    for i, seg in enumerate(segments):
        new = seg.get("weight_version")
        if i > 0:
            old = segments[i - 1].get("weight_version_end", segments[i - 1].get("weight_version"))
            change = f"version {old} → {new}" if str(old) != str(new) else f"version {new}"
            title = f"weight load: the turn was interrupted and went on under {change}"
            marks[offset + int(seg.get("start", 0))] = _marker(f"⇢ v{new}", title)
        if "weight_version_end" in seg:
            title = (
                f"weights changed from {new} to {seg['weight_version_end']} somewhere in "
                "these tokens (keep mode: the engine froze the request across the load)"
            )
            marks.setdefault(offset + int(seg.get("start", 0)), _marker("⇢ ?", title))
    return marks


def _marker(label: str, title: str) -> str:
    return f'<span class="seg" title="{escape(title)}">{escape(label)}</span>'


def _fit(values: Any, n: int, fill: Any) -> list[Any]:
    out = list(values) if isinstance(values, list) else []
    return out[:n] + [fill] * (n - len(out))


def timing_bars(timing: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The stage timings as bars of one line (SVG: x and width in percent)."""
    if not timing:
        return []
    parts = [
        ("queued", float(timing.get("queued_s", 0.0))),
        ("init", float(timing.get("init_s", 0.0))),
        ("run", float(timing.get("run_s", 0.0))),
        ("backend wait", float(timing.get("backend_wait_s", 0.0))),
        ("eval", float(timing.get("eval_s", 0.0))),
    ]
    total = sum(s for _, s in parts) or 1.0
    x, out = 0.0, []
    for name, seconds in parts:
        width = 100.0 * seconds / total
        out.append(
            {
                "name": name,
                "seconds": seconds,
                "x": round(x, 3),
                "width": round(width, 3),
                "cls": name.replace(" ", "-"),
            }
        )
        x += width
    return out
