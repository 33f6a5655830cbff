"""The first prompt the ``math`` handler's agent loop sends for a train-demo problem.

The messages come from the handler's own instance validation (its default system prompt),
the tools are what its ``SandboxTools`` lists, and the text is what
:meth:`ChatTokenizer.prompt_ids` renders: nothing here restates the handler's strings.
"""

from __future__ import annotations

import functools
from typing import Any

from handlers.math import TOOLS, MathHandler, MathInstance
from prorl_async.core.agent import TOOL_SPECS
from prorl_async.demo.train_tokenizer import CHAT_TEMPLATE
from prorl_async.llm.agent_loop import FINISH_TOOL_SPEC
from prorl_async.llm.chat_template import ChatTemplate
from prorl_async.llm.tokenizer import ChatTokenizer
from prorl_async.train_demo.task import instance

__all__ = ["prompt_ids", "prompt_messages", "prompt_text", "prompt_tools"]


def prompt_messages(a: int, b: int) -> list[dict[str, str]]:
    """``[system, user]`` as ``MathHandler.run`` builds them for ``instance(a, b)``."""
    inst: MathInstance = MathHandler().validate(instance(a, b))
    return [
        {"role": "system", "content": inst.system},
        {"role": "user", "content": inst.problem},
    ]


def prompt_tools() -> list[dict[str, Any]]:
    """The tool specs the loop gives the template: ``SandboxTools(_, TOOLS).specs``."""
    return [TOOL_SPECS[name] for name in TOOLS] + [FINISH_TOOL_SPEC]


@functools.cache
def _template() -> ChatTemplate:
    return ChatTemplate(CHAT_TEMPLATE)


def prompt_text(a: int, b: int) -> str:
    """The rendered first prompt (assistant header included), with the task chat template."""
    return _template().render(
        prompt_messages(a, b), tools=prompt_tools(), add_generation_prompt=True
    )


def prompt_ids(tokenizer: ChatTokenizer, a: int, b: int) -> list[int]:
    """The agent loop's ``prompt_ids`` for ``a + b`` with ``tokenizer``."""
    return tokenizer.prompt_ids(prompt_messages(a, b), prompt_tools())
