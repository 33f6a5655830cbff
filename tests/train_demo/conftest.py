"""The task tokenizer, built once per session, and the engine venv (skipped as the engine
tests skip it: ``no vLLM CPU environment at ...``, a failure under ``PRORL_REQUIRE_ENGINE=1``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer
from prorl_async.train_demo.vocab import build_task_tokenizer
from tests.engines.conftest import engine_env

__all__ = ["engine_env", "task_tok", "task_tok_dir"]


@pytest.fixture(scope="session")
def task_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_task_tokenizer(tmp_path_factory.mktemp("task-vocab"))


@pytest.fixture(scope="session")
def task_tok(task_tok_dir: Path) -> ChatTokenizer:
    return load_tokenizer(task_tok_dir)
