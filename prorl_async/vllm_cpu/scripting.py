"""vLLM logits processor that makes a random model follow scripts (``scripts.ScriptBook``).

Started with ``--logits-processors prorl_async.vllm_cpu.scripting:ScriptedReplies`` (the
engine imports this module; its ``PYTHONPATH`` holds this checkout). Runs inside vLLM only:
it imports torch and vLLM. The logprobs vLLM reports stay the model's own (vLLM computes
them from the raw logits), so a scripted trajectory replays like any other.
"""

from __future__ import annotations

from typing import Any

import torch
from tokenizers import Tokenizer
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from prorl_async.vllm_cpu.scripts import ScriptBook, Turn

__all__ = ["ScriptedReplies"]


class ScriptedReplies(LogitsProcessor):
    """Forces the scripted token of every request whose seed has a script."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        tokenizer = Tokenizer.from_file(f"{vllm_config.model_config.tokenizer}/tokenizer.json")
        eos = tokenizer.token_to_id("<|im_end|>")
        if eos is None:
            raise ValueError("the model's tokenizer has no <|im_end|> token to end a turn")
        header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False).ids

        def encode(text: str) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False).ids)

        self.book = ScriptBook(encode, header, eos, None)
        # batch row -> (the turn, the request's live list of generated ids)
        self.rows: dict[int, tuple[Turn, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(
            params: Any, prompt: list[int] | None, output: list[int]
        ) -> tuple[Turn, list[int]] | None:
            turn = self.book.turn(params.seed, prompt or [])
            return None if turn is None else (turn, output)

        process_dict_updates(self.rows, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        rows = list(self.rows)
        tokens = [turn.next_token(len(output)) for turn, output in self.rows.values()]
        index = torch.tensor(rows, device=logits.device)
        forced = torch.tensor(tokens, device=logits.device)
        logits[index] = float("-inf")
        logits[index, forced] = 0.0
        return logits
