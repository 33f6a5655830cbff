"""A learner in the engine's venv (torch is there), tiny policies for it, and the task
tokenizer (built once per session).

Without the engine venv (``prorl-async vllm-cpu setup``) the tests that need one skip with
the engine tests' reason, unless ``PRORL_REQUIRE_ENGINE=1`` (CI) makes that a failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from prorl_async.llm.tokenizer import ChatTokenizer, load_tokenizer
from prorl_async.train_demo import Learner
from prorl_async.train_demo.vocab import build_task_tokenizer
from prorl_async.vllm_cpu import EngineEnv
from tests.engines.conftest import engine_env

__all__ = ["engine_env", "task_tok", "task_tok_dir"]

# Importing torch and transformers takes seconds on an idle machine, a minute on a busy one.
LEARNER_TIMEOUT = pytest.mark.timeout(600)
INIT_S = 300.0
OP_S = 120.0

# The bundled demo tokenizer (6,144 ids) and its special tokens' ids.
BUNDLED_TOKENIZER = Path(__file__).resolve().parents[2] / "prorl_async/assets/tokenizer"
ENDOFTEXT, IM_START, IM_END = 0, 1, 2


def tiny_config(vocab_size: int = 512, **overrides: Any) -> dict[str, Any]:
    """A small Qwen3 vLLM CPU can serve (head_dim 32: the CPU kernels take no less)."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": [IM_END, ENDOFTEXT],
        **overrides,
    }


LearnerFactory = Callable[..., AbstractAsyncContextManager[Learner]]


@pytest.fixture
def make_learner(engine_env: EngineEnv, tmp_path: Path) -> LearnerFactory:
    """``async with make_learner(config=..., seed=...) as learner``: started and ``init``-ed."""

    @asynccontextmanager
    async def factory(**init: Any) -> AsyncIterator[Learner]:
        init.setdefault("config", tiny_config())
        init.setdefault("threads", 1)
        log = tmp_path / f"learner-{len(list(tmp_path.glob('learner-*')))}.log"
        async with Learner(log_path=log, env=engine_env) as learner:
            await learner.call("init", INIT_S, **init)
            yield learner

    return factory


@pytest.fixture(scope="session")
def task_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_task_tokenizer(tmp_path_factory.mktemp("task-vocab"))


@pytest.fixture(scope="session")
def task_tok(task_tok_dir: Path) -> ChatTokenizer:
    return load_tokenizer(task_tok_dir)
