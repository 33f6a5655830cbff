"""Loading tokenizer directories, and the bundled demo tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import tokenizers

from prorl_async.demo import train_tokenizer
from prorl_async.llm.tokenizer import BUNDLED_TOKENIZER_DIR, TokenizerError, load_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def make_dir(
    tmp_path: Path, config: dict[str, Any] | None, files: dict[str, str] | None = None
) -> Path:
    shutil.copy(BUNDLED_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    for name, text in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_bundled_tokenizer_shape() -> None:
    tok = load_tokenizer()
    assert tok.eos_token == "<|im_end|>"
    assert 4000 <= tok.vocab_size <= 8192
    for token in SPECIALS + TOOL_TAGS:
        ids = tok.encode(token)
        assert len(ids) == 1, token
        assert tok.decode(ids) == token
    assert tok.encode("<|im_end|>") == [tok.eos_id]
    size = sum(f.stat().st_size for f in BUNDLED_TOKENIZER_DIR.iterdir())
    assert size < 1_000_000
    assert "not for real training" in (BUNDLED_TOKENIZER_DIR / "README.md").read_text()


def test_bundled_round_trip_of_plain_text() -> None:
    tok = load_tokenizer()
    text = 'Solve 12x + 7 = 43. <tool_call>\n{"name": "bash"}\n</tool_call> déjà vu 東京'
    assert tok.decode(tok.encode(text)) == text


def test_training_script_reproduces_bundled_files(tmp_path: Path) -> None:
    train_tokenizer.main([str(tmp_path)])
    fresh, bundled = tmp_path, BUNDLED_TOKENIZER_DIR
    config = "tokenizer_config.json"
    assert (fresh / config).read_bytes() == (bundled / config).read_bytes()
    if f"`tokenizers` {tokenizers.__version__} " in (bundled / "README.md").read_text():
        for name in ("tokenizer.json", "README.md"):
            assert (fresh / name).read_bytes() == (bundled / name).read_bytes(), name
    else:  # another tokenizers release may serialise differently: compare what matters
        new, old = (json.loads((d / "tokenizer.json").read_text()) for d in (fresh, bundled))
        for key in ("added_tokens", "pre_tokenizer"):
            assert new[key] == old[key], key
        assert new["model"]["vocab"] == old["model"]["vocab"]
        assert new["model"]["merges"] == old["model"]["merges"]


def test_list_form_template_and_dict_special_tokens(tmp_path: Path) -> None:
    config = {
        "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"},
        "bos_token": {"content": "<|endoftext|>"},
        "chat_template": [
            {"name": "default", "template": "D{{ bos_token }}{{ messages[0].content }}"},
            {"name": "tool_use", "template": "T{{ tools | length }}{{ eos_token }}"},
        ],
    }
    tok = load_tokenizer(make_dir(tmp_path, config))
    assert tok.eos_token == "<|im_end|>"
    assert set(tok.templates) == {"default", "tool_use"}
    assert tok.render([{"role": "user", "content": "x"}]) == "D<|endoftext|>x"
    assert tok.render([], [{"name": "f"}]) == "T1<|im_end|>"


def test_template_files_and_special_tokens_map(tmp_path: Path) -> None:
    directory = make_dir(
        tmp_path,
        {"chat_template": "from-config"},
        {
            "chat_template.jinja": "from-file {{ eos_token }}",
            "additional_chat_templates/rag.jinja": "rag",
            "special_tokens_map.json": json.dumps({"eos_token": {"content": "<|endoftext|>"}}),
        },
    )
    tok = load_tokenizer(str(directory))
    assert tok.eos_token == "<|endoftext|>"
    assert tok.render([]) == "from-file <|endoftext|>"
    assert tok.templates["rag"].source == "rag"


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (None, "missing tokenizer_config.json"),
        ({"chat_template": "x"}, "no eos_token"),
        ({"eos_token": "<|im_end|>"}, "no chat template"),
        ({"eos_token": "<|im_end|>", "chat_template": 3}, "chat_template must be"),
        ({"eos_token": "<|im_end|>", "chat_template": [{"name": "a"}]}, r"chat_template\[0\]"),
        ({"eos_token": ["x"], "chat_template": "x"}, "eos_token must be a string"),
        ({"eos_token": "<nope>", "chat_template": "x"}, "'<nope>' is not in tokenizer.json"),
        ({"eos_token": "Ġthe", "chat_template": "x"}, "does not encode to its single id"),
        (
            {"eos_token": "<|im_end|>", "chat_template": "{% if %}"},
            "chat template 'default': chat template syntax error",
        ),
    ],
)
def test_bad_directories_are_named(
    tmp_path: Path, config: dict[str, Any] | None, match: str
) -> None:
    with pytest.raises(TokenizerError, match=match):
        load_tokenizer(make_dir(tmp_path, config))


def test_missing_directory_and_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="tokenizer directory not found"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(TokenizerError, match="missing tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="tokenizer.json: cannot load"):
        load_tokenizer(tmp_path)


def test_no_default_template_among_several(tmp_path: Path) -> None:
    config = {
        "eos_token": "<|im_end|>",
        "chat_template": [{"name": "a", "template": "a"}, {"name": "b", "template": "b"}],
    }
    tok = load_tokenizer(make_dir(tmp_path, config))
    with pytest.raises(TokenizerError, match="no 'default' chat template among: a, b"):
        tok.render([])


def test_added_token_ids_are_the_chat_tokens() -> None:
    tok = load_tokenizer()
    assert {tok.decode([i]) for i in tok.added_token_ids} == set(SPECIALS + TOOL_TAGS)
    assert tok.hf_tokenizer.get_vocab_size() == tok.vocab_size


def test_first_prompts_are_reused_exactly_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GRPO group renders one prompt many times: tokenized once, each caller gets its
    own list of the same ids, and the cache holds at most its character budget."""
    from prorl_async.llm import tokenizer as module

    tok = load_tokenizer(BUNDLED_TOKENIZER_DIR)
    calls: list[str] = []
    encode = tok.encode

    def counted(text: str) -> list[int]:
        calls.append(text)
        return encode(text)

    monkeypatch.setattr(tok, "encode", counted)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    first = tok.prompt_ids(messages)
    first.append(-1)  # a caller's own list: the next one is unchanged
    second = tok.prompt_ids(messages)
    assert second == encode(tok.render(messages, add_generation_prompt=True))
    assert len(calls) == 1
    monkeypatch.setattr(module, "PROMPT_CACHE_CHARS", 4 * len(calls[0]))
    for k in range(10):
        tok.prompt_ids([{"role": "user", "content": f"What is {k + 10} + 3?"}])
    assert tok._prompt_chars <= module.PROMPT_CACHE_CHARS
    assert len(calls) == 11
