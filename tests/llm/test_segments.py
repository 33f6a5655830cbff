"""Incremental segments: prompt once, then observations as exact template suffixes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prorl_async.llm.chat_template import ChatTemplate
from prorl_async.llm.tokenizer import (
    BUNDLED_TOKENIZER_DIR,
    ChatTokenizer,
    TemplateNotPrefixStableError,
    TokenizerError,
    load_tokenizer,
)
from tests.qwen import CHAT_TEMPLATE

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
PROMPT = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "How many files are there?"},
]
OBS = [{"role": "tool", "content": "a.txt\nb.txt"}, {"role": "tool", "content": '{"n": 2}'}]

# Qwen3-like (tests/qwen.py's template): reasoning (<think>) of assistant turns before the
# last real user query is dropped from history, and the *last* assistant turn gets an (empty)
# think block added.
QWEN3_LIKE = CHAT_TEMPLATE


def with_template(tmp_path: Path, template: str) -> ChatTokenizer:
    (tmp_path / "tokenizer.json").symlink_to(BUNDLED_TOKENIZER_DIR / "tokenizer.json")
    config = {"eos_token": "<|im_end|>", "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return load_tokenizer(tmp_path)


def retemplated(tok: ChatTokenizer, template: str) -> ChatTokenizer:
    """``tok``'s vocabulary (already loaded) with another chat template."""
    return ChatTokenizer(
        tok.hf_tokenizer, {"default": ChatTemplate(template)}, eos_token="<|im_end|>"
    )


def assistant(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def test_prompt_ids_are_the_rendered_prompt_with_header(tok: ChatTokenizer) -> None:
    ids = tok.prompt_ids(PROMPT, TOOLS)
    assert tok.decode(ids) == tok.render(PROMPT, TOOLS, add_generation_prompt=True)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("prev_ended", [True, False])
def test_observation_is_exact_suffix_of_full_rendering(
    tok: ChatTokenizer, prev_ended: bool
) -> None:
    reply = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
    model_ids = tok.encode(reply) + ([tok.eos_id] if prev_ended else [])
    obs = tok.observation_ids(OBS, prev_ended=prev_ended, tools=TOOLS)
    buffer = tok.prompt_ids(PROMPT, TOOLS) + model_ids + obs
    # The same conversation rendered in one go and tokenized once gives the very same ids.
    full = tok.render([*PROMPT, assistant(reply), *OBS], TOOLS, add_generation_prompt=True)
    assert buffer == tok.encode(full)
    # The segment starts right after the end-of-turn id (added when the model lacked it).
    assert obs[0] == tok.eos_id if not prev_ended else obs[0] != tok.eos_id
    assert tok.decode(obs).endswith("<|im_start|>assistant\n")


def test_segment_text_matches_ids_and_is_independent_of_history(tok: ChatTokenizer) -> None:
    text, ids = tok.observation_segment(OBS, prev_ended=True)
    assert tok.encode(text) == ids
    assert text.startswith("\n<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response>")
    assert tok.observation_ids(OBS, prev_ended=True) == ids
    with pytest.raises(ValueError, match="at least one message"):
        tok.observation_ids([], prev_ended=True)


def test_qwen3_like_template_history_rewrite_never_touches_the_buffer(tok: ChatTokenizer) -> None:
    tok = retemplated(tok, QWEN3_LIKE)
    first = "<think>\nI should list files.\n</think>\n\nLet me look.<|im_end|>"
    model_ids = tok.encode(first)
    prompt = tok.prompt_ids(PROMPT)
    obs = tok.observation_ids(OBS, prev_ended=True)
    buffer = prompt + model_ids + obs
    assert buffer[: len(prompt) + len(model_ids)] == prompt + model_ids
    # While the turn is current, the template keeps the reasoning: the incremental buffer is
    # exactly the one-shot rendering.
    conv = [*PROMPT, assistant(first.removesuffix("<|im_end|>")), *OBS]
    assert buffer == tok.encode(tok.render(conv, add_generation_prompt=True))
    # Once a new user query arrives the template drops that reasoning: a re-render would no
    # longer match what the model saw. The incremental segment after it is still a suffix.
    follow_up = [{"role": "user", "content": "And now?"}]
    rerendered = tok.render([*conv, assistant("2 files."), *follow_up], add_generation_prompt=True)
    assert "I should list files." not in rerendered
    seg_text, seg = tok.observation_segment(follow_up, prev_ended=True)
    assert rerendered.endswith(seg_text.lstrip("\n"))
    assert tok.encode(seg_text) == seg


def test_qwen3_like_last_assistant_quirk_does_not_break_the_dummy(tok: ChatTokenizer) -> None:
    tok = retemplated(tok, QWEN3_LIKE)
    # Rendering an assistant turn last adds an empty think block that disappears once a tool
    # turn follows: the reason the dummy conversation ends with a user turn.
    last = tok.render([*PROMPT, assistant("x")])
    later = tok.render([*PROMPT, assistant("x"), *OBS])
    assert "<think>" in last and "<think>" not in later
    assert tok.decode(tok.observation_ids(OBS, prev_ended=False)).startswith("<|im_end|>\n")


def test_template_that_is_not_prefix_stable_fails_loudly(tmp_path: Path) -> None:
    unstable = (
        "<|im_start|>system\n{{ messages | length }} messages<|im_end|>\n"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = with_template(tmp_path, unstable)
    with pytest.raises(
        TemplateNotPrefixStableError, match="not prefix-stable.*2 messages.*became.*4 messages"
    ):
        tok.observation_ids(OBS, prev_ended=True)


def test_template_without_end_of_turn_token_is_refused(tmp_path: Path) -> None:
    no_eos = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    tok = with_template(tmp_path, no_eos)
    with pytest.raises(TokenizerError, match="does not end a user turn with eos_token"):
        tok.observation_ids(OBS, prev_ended=True)
