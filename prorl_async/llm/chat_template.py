"""Chat templates rendered the way Hugging Face ``apply_chat_template`` does, but sandboxed.

Templates come from tokenizer directories we do not control, so they run in jinja2's
``ImmutableSandboxedEnvironment``: no attribute tricks (``__class__``, ``__globals__``), no
mutating the messages passed in. The environment mirrors transformers' own (``trim_blocks``,
``lstrip_blocks``, ``loopcontrols``, a ``tojson`` that does not HTML-escape, ``raise_exception``,
``strftime_now`` and a no-op ``{% generation %}`` block) so real model templates render
identically.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "TemplateError"]


class TemplateError(ValueError):
    """A chat template failed to compile or render (including sandbox refusals)."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (HF assistant masks): render the body as is."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(f"chat template raised: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in tojson HTML-escapes '<', '>' and '&'; HF templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """One compiled chat template.

    ``special_tokens`` (``bos_token``, ``eos_token``, ...) are passed to every render as
    template variables, as transformers does.
    """

    def __init__(self, source: str, *, special_tokens: Mapping[str, str | None] | None = None):
        if not isinstance(source, str) or not source.strip():
            raise TemplateError("chat template is empty or not a string")
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template syntax error line {exc.lineno}: {exc}") from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **extra: Any,
    ) -> str:
        """Render ``messages`` (and ``tools``) to text; raise TemplateError on any failure."""
        variables = {**self.special_tokens, **extra}
        try:
            return self._template.render(
                messages=messages,
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"chat template refused by the sandbox: {exc}") from exc
        except Exception as exc:  # a foreign template can fail in any way: name it and wrap it
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
