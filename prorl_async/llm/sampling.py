"""``sampling_params`` of a job: the fields both engines accept, checked at submit.

A job's ``sampling_params`` travel unchanged into the backend request (vLLM
``/v1/completions`` fields, SGLang ``/generate`` ``sampling_params``), apart from
``max_tokens``, which the agent loop cuts to the room left in the context. A job may
land on either engine, so only fields both accept are allowed; a bad value or an
unknown field is refused at submit (422 naming it), before any sandbox starts.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["SamplingParams", "SamplingParamsError", "check_sampling_params"]

_Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]


class SamplingParams(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Sampling fields accepted in ``sampling_params`` (the engines' own meaning); no nulls."""

    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | UnsetType = UNSET
    temperature: Annotated[float, msgspec.Meta(ge=0.0)] | UnsetType = UNSET
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | UnsetType = UNSET
    # -1 (or 0 on vLLM) turns top-k off.
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | UnsetType = UNSET
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | UnsetType = UNSET
    presence_penalty: _Penalty | UnsetType = UNSET
    frequency_penalty: _Penalty | UnsetType = UNSET
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] | UnsetType = UNSET
    stop: str | list[str] | UnsetType = UNSET
    stop_token_ids: list[Annotated[int, msgspec.Meta(ge=0)]] | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    ignore_eos: bool | UnsetType = UNSET
    skip_special_tokens: bool | UnsetType = UNSET
    spaces_between_special_tokens: bool | UnsetType = UNSET


_FIELDS = ", ".join(SamplingParams.__struct_fields__)


class SamplingParamsError(ValueError):
    """``sampling_params`` the engines would refuse; the message names the field."""


def check_sampling_params(params: dict[str, Any]) -> None:
    """Raise ``SamplingParamsError`` naming the first bad field of ``params``."""
    if not params:  # none given (most jobs): nothing to check
        return
    try:
        msgspec.convert(params, SamplingParams)
    except msgspec.ValidationError as exc:
        raise SamplingParamsError(_message(str(exc))) from None


def _message(message: str) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.max_tokens`": lead with the field.
    text, at, path = message.partition(" - at `")
    field = path.rstrip("`").replace("$", "sampling_params", 1) if at else "sampling_params"
    if "unknown field" in text:
        text += f" (accepted: {_FIELDS})"
    return f"{field}: {text}"
