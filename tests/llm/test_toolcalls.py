"""Hermes/Qwen tool-call parsing."""

from __future__ import annotations

from prorl_async.llm.toolcalls import MalformedToolCall, ToolCall, parse_tool_calls


def test_several_calls_in_order() -> None:
    text = (
        'Thinking.<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
        '\n<tool_call>{"name": "finish", "arguments": "{\\"answer\\": \\"2\\"}"}</tool_call>'
        "<|im_end|>"
    )
    assert parse_tool_calls(text) == [
        ToolCall(name="bash", arguments={"command": "ls"}),
        ToolCall(name="finish", arguments={"answer": "2"}),
    ]


def test_no_calls_and_missing_arguments() -> None:
    assert parse_tool_calls("The answer is 4.<|im_end|>") == []
    assert parse_tool_calls('<tool_call>{"name": "noop"}</tool_call>') == [
        ToolCall(name="noop", arguments={})
    ]


def test_malformed_calls_say_why() -> None:
    text = (
        "<tool_call>{not json}</tool_call>"
        "<tool_call>[1, 2]</tool_call>"
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>'
        '<tool_call>{"name": "bash", "arguments": "{oops"}</tool_call>'
        '<tool_call>{"name": "bash", "argu'
    )
    calls = parse_tool_calls(text)
    assert all(isinstance(c, MalformedToolCall) for c in calls)
    errors = [c.error for c in calls if isinstance(c, MalformedToolCall)]
    assert errors[0].startswith("tool call is not valid JSON")
    assert errors[1] == "tool call must be a JSON object"
    assert errors[2] == 'tool call needs a string "name"'
    assert errors[3] == errors[4] == "\"arguments\" of 'bash' must be a JSON object"
    assert errors[5] == "missing </tool_call>"
    assert calls[3].name == "bash"
