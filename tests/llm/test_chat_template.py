"""Sandboxed, HF-compatible chat template rendering."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prorl_async.llm.chat_template import ChatTemplate, TemplateError
from prorl_async.llm.tokenizer import load_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a <command> & print",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def bundled() -> ChatTemplate:
    return load_tokenizer().template_for(TOOLS)


def test_bundled_template_renders_tools_calls_and_responses() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "List files."},
        {
            "role": "assistant",
            "content": "Listing.",
            "tool_calls": [{"function": {"name": "bash", "arguments": {"command": "ls"}}}],
        },
        {"role": "tool", "content": "a.txt"},
        {"role": "tool", "content": "b.txt"},
    ]
    text = bundled().render(messages, tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    # tojson must not HTML-escape (jinja's builtin would give \u003c).
    assert json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>' in text
    assert (
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n"
        "<tool_response>\nb.txt\n</tool_response><|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>assistant\n")


def test_no_tools_no_generation_prompt() -> None:
    text = bundled().render([{"role": "user", "content": "hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_hf_globals_filters_and_whitespace_control() -> None:
    source = (
        "{% for m in messages %}\n"
        "  {% if loop.index > 2 %}{% break %}{% endif %}\n"
        "{% generation %}[{{ m.content }}]{% endgeneration %}\n"
        "{% endfor %}{{ eos_token }}{{ strftime_now('%Y') | length }}"
        "{{ {'a': '<b>'} | tojson }}"
    )
    tpl = ChatTemplate(source, special_tokens={"eos_token": "</s>"})
    msgs = [{"role": "user", "content": str(i)} for i in range(5)]
    assert tpl.render(msgs) == '[0][1]</s>4{"a": "<b>"}'


def test_raise_exception_is_a_template_error() -> None:
    tpl = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        tpl.render([])


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ raise_exception.__globals__['os'].system('true') }}",
        "{{ messages.append({'role': 'x'}) }}",
        "{% set _ = messages[0].update({'content': 'pwned'}) %}",
    ],
)
def test_sandbox_refuses_unsafe_code(source: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError, match="sandbox|unsafe|not safely callable"):
        ChatTemplate(source).render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


def test_syntax_error_and_empty_template_are_named() -> None:
    with pytest.raises(TemplateError, match="syntax error line 1"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(TemplateError, match="empty"):
        ChatTemplate("  ")


def test_undefined_attribute_failure_is_wrapped() -> None:
    with pytest.raises(TemplateError, match="UndefinedError"):
        ChatTemplate("{{ messages[0].content.nope.deeper }}").render([{"content": "x"}])
