"""``python -m prorl_async.scripted_llm``: run the scripted LLM test double."""

from __future__ import annotations

import sys

from prorl_async.scripted_llm._cli import main

sys.exit(main())
