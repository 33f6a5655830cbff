"""The task tokenizer: small, deterministic, short prompts, single-digit tokens, exact decode."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from prorl_async.demo.train_tokenizer import SPECIAL_TOKENS, TOOL_TOKENS
from prorl_async.llm.tokenizer import ChatTokenizer
from prorl_async.train_demo.prompt import prompt_ids, prompt_text
from prorl_async.train_demo.task import OPERANDS, answer_text, held_out_problems, problems
from prorl_async.train_demo.vocab import VOCAB_SIZE, model_vocab_size

ROOT = Path(__file__).resolve().parents[2]
MAX_PROMPT_TOKENS = 64
FILES = ("tokenizer.json", "tokenizer_config.json")


def _all_pairs() -> list[tuple[int, int]]:
    return [(a, b) for a in OPERANDS for b in OPERANDS]


def _arbitrary_texts(seed: int = 0, count: int = 200) -> list[str]:
    rng = random.Random(seed)
    pieces = [
        "<|im_end|>",
        "<|im_",
        "<tool_call>",
        "</tool_",
        "\\boxed{",
        "What is ",
        " + ",
        "?",
        "\r\n",
        "\t",
        "  ",
        "\x00",
        "e\u0301",
        "\u00e9",
        "日本語",
        "🎉",
        "\ufeff",
        '{"a": 1}',
    ]
    texts = []
    for _ in range(count):
        parts = [
            rng.choice(pieces) if rng.random() < 0.5 else chr(rng.randrange(1, 0x2FFFF))
            for _ in range(rng.randint(1, 30))
        ]
        texts.append("".join(p for p in parts if not 0xD800 <= ord(p[0]) <= 0xDFFF))
    return texts


def test_the_build_is_byte_for_byte_reproducible(task_tok_dir: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    cmd = [sys.executable, "-m", "prorl_async.train_demo.vocab", str(tmp_path)]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=120)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (task_tok_dir / name).read_bytes(), name


def test_the_vocabulary_is_small(task_tok: ChatTokenizer, task_tok_dir: Path) -> None:
    assert task_tok.vocab_size <= VOCAB_SIZE
    size = model_vocab_size(task_tok_dir)
    assert size % 64 == 0 and task_tok.vocab_size <= size < task_tok.vocab_size + 64
    assert max(task_tok.hf_tokenizer.get_vocab().values()) < task_tok.vocab_size


def test_added_tokens_are_single_ids_special_as_in_qwen(task_tok: ChatTokenizer) -> None:
    """ChatML markers first and special; the tool tags after the BPE vocabulary, not special."""
    added = task_tok.hf_tokenizer.get_added_tokens_decoder()
    by_content = {token.content: (i, token.special) for i, token in added.items()}
    last = task_tok.vocab_size - len(TOOL_TOKENS)
    assert by_content == {
        **{t: (i, True) for i, t in enumerate(SPECIAL_TOKENS)},
        **{t: (last + i, False) for i, t in enumerate(TOOL_TOKENS)},
    }
    for token, (token_id, _) in by_content.items():
        assert task_tok.encode(token) == [token_id]
    assert task_tok.eos_id == by_content["<|im_end|>"][0]


def test_math_prompts_are_short(task_tok: ChatTokenizer) -> None:
    # Only the operands vary: every digit count of A and B, and a sample of the rest.
    pairs = [(0, 0), (0, 99), (99, 0), (99, 99), *problems(2, 300), *held_out_problems()[:100]]
    lengths = {len(prompt_ids(task_tok, a, b)) for a, b in pairs}
    assert max(lengths) <= MAX_PROMPT_TOKENS, sorted(lengths)


def test_answers_are_a_few_tokens(task_tok: ChatTokenizer) -> None:
    boxed = task_tok.encode("\\boxed{")
    assert len(boxed) == 1
    for a, b in [(0, 0), (5, 7), (99, 99)]:
        digits = [task_tok.encode(d)[0] for d in str(a + b)]
        ids = task_tok.encode(answer_text(a, b) + "<|im_end|>")
        assert ids == boxed + digits + task_tok.encode("}") + [task_tok.eos_id]


def test_digits_are_single_tokens_never_merged(task_tok: ChatTokenizer) -> None:
    digit_ids = [task_tok.encode(str(d)) for d in range(10)]
    assert all(len(ids) == 1 for ids in digit_ids)
    merged = [
        t for t in task_tok.hf_tokenizer.get_vocab() if len(t) > 1 and any(c.isdigit() for c in t)
    ]
    assert merged == []
    assert task_tok.encode("x=90210.") == task_tok.encode("x=") + [
        digit_ids[int(c)][0] for c in "90210"
    ] + task_tok.encode(".")


def test_prompt_then_answer_tokenizes_as_the_two_apart(task_tok: ChatTokenizer) -> None:
    """What the engine is fed (prompt ids) and what it emits (answer ids) join exactly as
    the whole text tokenizes, so a learner may tokenize either way."""
    for a, b in problems(0, 100) + list(held_out_problems()[:100]):
        answer = task_tok.encode(answer_text(a, b) + "<|im_end|>")
        whole = task_tok.encode(prompt_text(a, b) + answer_text(a, b) + "<|im_end|>")
        assert whole == prompt_ids(task_tok, a, b) + answer


@pytest.mark.parametrize("kind", ["prompts", "answers", "arbitrary"])
def test_decode_inverts_encode(task_tok: ChatTokenizer, kind: str) -> None:
    if kind == "prompts":
        texts = [prompt_text(a, b) for a, b in problems(1, 200)]
    elif kind == "answers":
        texts = [answer_text(a, b) + "<|im_end|>" for a, b in _all_pairs()]
    else:
        texts = _arbitrary_texts()
    for text in texts:
        assert task_tok.decode(task_tok.encode(text)) == text
