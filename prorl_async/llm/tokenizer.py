"""Chat tokenizers for token-in/token-out rollouts.

A :class:`ChatTokenizer` wraps a Hugging Face tokenizer directory (``tokenizer.json`` read with
the ``tokenizers`` library, chat template and special tokens from ``tokenizer_config.json`` or
``chat_template.jinja``) and produces a rollout's token buffer *incrementally*: the prompt is
tokenized once, and each observation is tokenized on its own as just the template text it adds
(see :meth:`ChatTokenizer.observation_ids`). Nothing already in the buffer is ever re-rendered
or re-tokenized, so the ids the model produced are kept exactly.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from prorl_async.llm.chat_template import ChatTemplate, TemplateError

__all__ = [
    "BUNDLED_TOKENIZER_DIR",
    "ChatTokenizer",
    "TemplateNotPrefixStableError",
    "TokenizerError",
    "load_tokenizer",
]

BUNDLED_TOKENIZER_DIR = Path(__file__).parents[1] / "assets" / "tokenizer"
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# The fixed conversation observations are appended to when computing their template segment.
# It ends with a user turn, not an assistant one: templates such as Qwen3's render the *last*
# assistant message differently (an empty <think> block), which would break the prefix.
_DUMMY: tuple[dict[str, Any], ...] = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello."},
)
# First prompts kept tokenized, by their rendered text: a GRPO group's samples, and every
# job of a task set that shares a system prompt, render the same text. Bounded by the
# characters held, so long agent prompts cannot grow it without limit.
PROMPT_CACHE_CHARS = 4 * 1024 * 1024


class TokenizerError(ValueError):
    """A tokenizer directory is unusable; the message names the file or field at fault."""


class TemplateNotPrefixStableError(TokenizerError):
    """Appending messages changed the rendering of the conversation before them."""


class ChatTokenizer:
    """A tokenizer plus its chat template(s), producing token segments for the agent loop."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        templates: Mapping[str, ChatTemplate],
        *,
        eos_token: str,
        source: str = "<memory>",
    ) -> None:
        self._tok = tokenizer
        self.templates = dict(templates)
        self.eos_token = eos_token
        self.source = source
        self.eos_id = _single_id(tokenizer, eos_token, source)
        self._prompts: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._prompt_chars = 0

    @property
    def hf_tokenizer(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    @property
    def added_token_ids(self) -> frozenset[int]:
        """Ids of added tokens (special or not): the points joins never drift at."""
        return frozenset(int(i) for i in self._tok.get_added_tokens_decoder())

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with no BOS/EOS added (special-token strings map to their ids)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` keeping special tokens, for parsing only (never re-encode it)."""
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each id's own text, special tokens kept (for display: a token that holds part
        of a multi-byte character shows as U+FFFD)."""
        return [
            str(t) for t in self._tok.decode_batch([[i] for i in ids], skip_special_tokens=False)
        ]

    def template_for(self, tools: Sequence[Mapping[str, Any]] | None) -> ChatTemplate:
        """The template HF would pick: ``tool_use`` when tools are given and it exists."""
        if tools and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        if len(self.templates) == 1:
            return next(iter(self.templates.values()))
        names = ", ".join(sorted(self.templates))
        raise TokenizerError(f"{self.source}: no 'default' chat template among: {names}")

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = False,
    ) -> str:
        """Render ``messages`` with the chat template (text, not tokens)."""
        template = self.template_for(tools)
        return template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt)

    def prompt_ids(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """The first prompt: ``messages`` rendered with the assistant header, tokenized once
        (the ids of a text rendered recently are reused: tokenizing is deterministic)."""
        text = self.render(messages, tools, add_generation_prompt=True)
        cached = self._prompts.get(text)
        if cached is not None:
            self._prompts.move_to_end(text)
            return list(cached)
        ids = self.encode(text)
        if len(text) <= PROMPT_CACHE_CHARS // 4:
            self._prompts[text] = tuple(ids)
            self._prompt_chars += len(text)
            while self._prompt_chars > PROMPT_CACHE_CHARS:
                old, _ = self._prompts.popitem(last=False)
                self._prompt_chars -= len(old)
        return ids

    def observation_segment(
        self,
        tool_messages: Sequence[Mapping[str, Any]],
        *,
        prev_ended: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[str, list[int]]:
        """Text and ids appended after an assistant turn: see :meth:`observation_ids`."""
        if not tool_messages:
            raise ValueError("observation needs at least one message")
        base = self.render(_DUMMY, tools)
        full = self.render([*_DUMMY, *tool_messages], tools, add_generation_prompt=True)
        _check_prefix(base, full, self.source)
        cut = base.rfind(self.eos_token)
        if cut < 0:
            raise TokenizerError(
                f"{self.source}: the chat template does not end a user turn with eos_token "
                f"{self.eos_token!r}; cannot find where an assistant turn ends"
            )
        # What the template puts after an end-of-turn token (ChatML: "\n") precedes the new turn.
        between = base[cut + len(self.eos_token) :]
        text = ("" if prev_ended else self.eos_token) + between + full[len(base) :]
        return text, self.encode(text)

    def observation_ids(
        self,
        tool_messages: Sequence[Mapping[str, Any]],
        *,
        prev_ended: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Ids of just the template segment that follows an assistant turn.

        That is: the end-of-turn token when the model's output lacks it (``prev_ended=False``,
        e.g. cut by ``length``), the tool turn(s) and the next assistant header. It is computed by
        rendering a fixed dummy conversation with and without ``tool_messages`` and tokenizing
        only the text difference; the segment starts right after an end-of-turn special token,
        so joining it to the buffer never changes how anything before it tokenizes.
        """
        return self.observation_segment(tool_messages, prev_ended=prev_ended, tools=tools)[1]


def _check_prefix(base: str, full: str, source: str) -> None:
    if full.startswith(base):
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(base, full, strict=False)) if a != b),
        min(len(base), len(full)),
    )
    raise TemplateNotPrefixStableError(
        f"{source}: chat template is not prefix-stable: appending tool messages changed the "
        f"rendering at char {at}: {base[max(0, at - 30) : at + 30]!r} became "
        f"{full[max(0, at - 30) : at + 30]!r}"
    )


def _single_id(tokenizer: Tokenizer, token: str, source: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise TokenizerError(f"{source}: eos_token {token!r} is not in tokenizer.json's vocabulary")
    ids = tokenizer.encode(token, add_special_tokens=False).ids
    if list(ids) != [token_id]:
        raise TokenizerError(
            f"{source}: eos_token {token!r} does not encode to its single id {token_id} "
            f"(got {list(ids)}); it must be an added token"
        )
    return int(token_id)


def load_tokenizer(path: str | Path | None = None) -> ChatTokenizer:
    """Load a Hugging Face tokenizer directory (``None``: the bundled demo tokenizer)."""
    directory = BUNDLED_TOKENIZER_DIR if path is None else Path(path)
    if not directory.is_dir():
        raise TokenizerError(f"tokenizer directory not found: {directory}")
    tokenizer = _read_tokenizer_json(directory)
    config = _read_json(directory / "tokenizer_config.json", required=True)
    specials = _special_tokens(directory, config)
    eos = specials.get("eos_token")
    if not eos:
        raise TokenizerError(
            f"{directory}: no eos_token in tokenizer_config.json or special_tokens_map.json"
        )
    templates = {
        name: _compile(directory, name, source, specials)
        for name, source in _template_sources(directory, config).items()
    }
    return ChatTokenizer(tokenizer, templates, eos_token=eos, source=str(directory))


def _compile(directory: Path, name: str, source: str, specials: dict[str, str]) -> ChatTemplate:
    try:
        return ChatTemplate(source, special_tokens=specials)
    except TemplateError as exc:
        raise TokenizerError(f"{directory}: chat template {name!r}: {exc}") from exc


def _read_tokenizer_json(directory: Path) -> Tokenizer:
    file = directory / "tokenizer.json"
    if not file.is_file():
        raise TokenizerError(
            f"{directory}: missing tokenizer.json (only 'fast' tokenizers are supported)"
        )
    try:
        return Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a plain Exception on any parse error
        raise TokenizerError(f"{file}: cannot load: {exc}") from exc


def _read_json(file: Path, *, required: bool) -> dict[str, Any]:
    if not file.is_file():
        if required:
            raise TokenizerError(f"{file.parent}: missing {file.name}")
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{file}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise TokenizerError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def _token_content(value: Any, field: str, file: Path) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(f"{file}: {field} must be a string or {{'content': str}}, got {value!r}")


def _special_tokens(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    fallback = _read_json(directory / "special_tokens_map.json", required=False)
    found: dict[str, str] = {}
    for name in _SPECIAL_NAMES:
        raw, file = config.get(name), directory / "tokenizer_config.json"
        if raw is None:
            raw, file = fallback.get(name), directory / "special_tokens_map.json"
        content = _token_content(raw, name, file)
        if content:
            found[name] = content
    return found


def _template_sources(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    file = directory / "tokenizer_config.json"
    raw = config.get("chat_template")
    sources: dict[str, str] = {}
    if isinstance(raw, str):
        sources["default"] = raw
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            if not (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                raise TokenizerError(f"{file}: chat_template[{i}] needs 'name' and 'template'")
            sources[item["name"]] = item["template"]
    elif raw is not None:
        raise TokenizerError(f"{file}: chat_template must be a string or a list of templates")
    sources.update(_template_files(directory))
    if not sources:
        raise TokenizerError(
            f"{directory}: no chat template (no chat_template in tokenizer_config.json "
            "and no chat_template.jinja)"
        )
    return sources


def _template_files(directory: Path) -> dict[str, str]:
    # Newer transformers save templates as files, which take precedence over the config.
    found: dict[str, str] = {}
    default = directory / "chat_template.jinja"
    if default.is_file():
        found["default"] = default.read_text(encoding="utf-8")
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            found[file.stem] = file.read_text(encoding="utf-8")
    return found
