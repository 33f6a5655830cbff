"""Loading the tokenizer the scripted LLM decodes prompts and encodes replies with."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

__all__ = ["BUNDLED", "byte_tokenizer", "load_tokenizer"]

BUNDLED = Path(__file__).resolve().parent.parent / "assets" / "tokenizer"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def byte_tokenizer() -> Tokenizer:
    """A byte-level tokenizer with the chat special tokens (one id per byte, no merges).

    Used only when no tokenizer directory is given and the bundled one is absent.
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def load_tokenizer(source: str | Path | Tokenizer | None = None) -> Tokenizer:
    """A tokenizer from a HF directory (``tokenizer.json``), an object, or the default.

    The default is the bundled ``prorl_async/assets/tokenizer``; a byte-level fallback
    stands in when that is not there. A tokenizer without ``<|im_end|>`` is refused.
    """
    if isinstance(source, Tokenizer):
        tok = source
    elif source is None:
        bundled = BUNDLED / "tokenizer.json"
        tok = Tokenizer.from_file(str(bundled)) if bundled.is_file() else byte_tokenizer()
    else:
        path = Path(source)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ValueError(f"tokenizer: no tokenizer.json at {path}")
        tok = Tokenizer.from_file(str(file))
    if tok.token_to_id("<|im_end|>") is None:
        raise ValueError("tokenizer has no <|im_end|> token; the scripted LLM needs it")
    return tok
