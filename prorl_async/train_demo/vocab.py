"""The train-demo's task vocabulary: a small byte-level BPE that swallows the fixed prompt.

Every math prompt repeats the same system turn and tool schema, so the BPE has no whitespace
pre-tokenizer: merges cross spaces and punctuation, and that fixed text ends up as a handful
of tokens. Digits are split one by one and never merged, so sums stay learnable; the
byte-level alphabet makes any text encode, and decode exactly (no normalizer). The chat
template, added tokens and ``tokenizer_config.json`` are the demo tokenizer's. The corpus is
generated from a seed, so the same seed and ``tokenizers`` version give the same files.

Run ``python -m prorl_async.train_demo.vocab OUT_DIR`` to write the directory.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from prorl_async.demo import train_tokenizer as demo_vocab
from prorl_async.train_demo.prompt import prompt_text
from prorl_async.train_demo.task import answer_text, problems

__all__ = [
    "ADDED_TOKENS",
    "SEED",
    "VOCAB_SIZE",
    "build_corpus",
    "build_task_tokenizer",
    "main",
    "model_vocab_size",
    "train",
]

# 256 byte symbols and 7 added tokens leave 505 merges: enough to fold the ~1.1k characters
# of fixed prompt text into a few tokens (at 512 the prompt stays near 285 tokens).
VOCAB_SIZE = 768
SEED = 40
MODEL_VOCAB_MULTIPLE = 64
CORPUS_PROBLEMS = 2000
# A little of the demo tokenizer's general text, so other text gets some merges too.
GENERAL_DOCS = 300
ADDED_TOKENS = demo_vocab.SPECIAL_TOKENS + demo_vocab.TOOL_TOKENS
_ADDED_SPLIT = re.compile("|".join(re.escape(token) for token in ADDED_TOKENS))


def _segments(text: str) -> list[str]:
    # Added tokens are cut out before the BPE runs, at training and at encoding alike.
    return [part for part in _ADDED_SPLIT.split(text) if part]


def build_corpus(seed: int = SEED) -> Iterator[str]:
    """Yield the training texts: rendered math prompts, answers and some general text."""
    for problem in problems(seed, CORPUS_PROBLEMS):
        yield from _segments(prompt_text(*problem))
        yield answer_text(*problem)
    # The demo corpus starts with its own source file: skipped, so edits there change nothing.
    for doc in itertools.islice(demo_vocab.build_corpus(seed), 1, 1 + GENERAL_DOCS):
        yield from _segments(doc)


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def train(vocab_size: int = VOCAB_SIZE, seed: int = SEED) -> Tokenizer:
    """Train the BPE on :func:`build_corpus`; ids as in Qwen: the ChatML markers first
    (special), the tool tags last (added, not special, so decoded text keeps them)."""
    tok = _tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(demo_vocab.TOOL_TOKENS),
        min_frequency=2,
        special_tokens=demo_vocab.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(seed), trainer=trainer)
    tok.add_tokens([AddedToken(t, normalized=False) for t in demo_vocab.TOOL_TOKENS])
    return tok


def build_task_tokenizer(
    out_dir: str | Path, *, vocab_size: int = VOCAB_SIZE, seed: int = SEED
) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` to ``out_dir``; return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train(vocab_size, seed)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False) + "\n", encoding="utf-8")
    config = json.dumps(demo_vocab.tokenizer_config(), indent=2, ensure_ascii=False) + "\n"
    (out / "tokenizer_config.json").write_text(config, encoding="utf-8")
    return out


def model_vocab_size(tokenizer_dir: str | Path) -> int:
    """The model's ``vocab_size``: every id of the tokenizer, rounded up to a multiple of 64."""
    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    size = int(tok.get_vocab_size(with_added_tokens=True))
    return -(-size // MODEL_VOCAB_MULTIPLE) * MODEL_VOCAB_MULTIPLE


def main(argv: list[str] | None = None) -> None:
    """``python -m prorl_async.train_demo.vocab OUT_DIR``: build the tokenizer directory."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m prorl_async.train_demo.vocab OUT_DIR")
    build_task_tokenizer(args[0])


if __name__ == "__main__":
    main()
