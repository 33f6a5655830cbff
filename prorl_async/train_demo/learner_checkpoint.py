"""The learner's policy on disk: build or load a Qwen3 in fp32, save an HF checkpoint vLLM loads.

Runs inside the engine's venv only (torch and transformers are imported inside the
functions). fp32 everywhere: vLLM serves the checkpoint with ``--dtype float32``, so the
two sides compute the same numbers and their logprobs agree to ~1e-6.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["TOKENIZER_FILES", "build_model", "eos_ids", "load_model", "save_checkpoint"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def eos_ids(config: Any) -> list[int]:
    """The ids that end a generation: ``eos_token_id`` (an id or a list), then
    ``bos_token_id`` when it differs (``<|im_end|>`` and ``<|endoftext|>`` in Qwen3)."""
    eos = config.eos_token_id
    ids = [int(i) for i in eos] if isinstance(eos, list | tuple) else [int(eos)]
    bos = config.bos_token_id
    if bos is not None and int(bos) not in ids:
        ids.append(int(bos))
    return ids


def build_model(config: dict[str, Any], seed: int) -> Any:
    """A seeded random ``Qwen3ForCausalLM`` from ``Qwen3Config(**config)``, fp32."""
    import torch
    import transformers

    torch.manual_seed(seed)
    qwen = transformers.Qwen3Config(**config, dtype="float32")
    return _ready(transformers.Qwen3ForCausalLM(qwen))


def load_model(model_dir: str) -> Any:
    """The HF checkpoint in ``model_dir``, fp32."""
    import torch
    import transformers

    model = transformers.Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return _ready(model)


def _ready(model: Any) -> Any:
    import torch
    import transformers

    model = model.to(torch.float32)
    # No dropout in Qwen3 (attention_dropout 0): eval mode throughout, one numeric path.
    model.eval()
    config = model.config
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos_ids(config)
    )
    return model


def save_checkpoint(model: Any, out: Path, tokenizer_dir: str | None) -> None:
    """Write weights, config, generation config and the tokenizer files to ``out``,
    atomically (``integrations.trl.save_policy``); an existing ``out`` is replaced."""
    from prorl_async.integrations.trl import save_policy

    files = [Path(tokenizer_dir) / name for name in TOKENIZER_FILES] if tokenizer_dir else []
    save_policy(model, out, files)
