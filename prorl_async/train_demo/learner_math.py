"""The learner's arithmetic: token logprobs of a causal LM, the SFT and GRPO losses.

Runs inside the engine's venv only: torch is imported inside the functions (the project's
own install never has it), and tensors are typed ``Any``.

Every op scores *response tokens given everything before them*. Sequences are
``prompt + response``, right-padded: with causal attention a real token never attends to
a pad after it, so no attention mask is needed and SDPA keeps its fast causal kernel (an
explicit mask measured 1.6x slower here). Positions are 0..L-1 per sequence.

The prompts of one batch share a long prefix (the system prompt, the task's framing): it
is run once at batch 1, its keys and values repeated for the batch, and only the rest of
each sequence runs at batch size. Gradients flow through the shared keys and values into
the prefix as they would through a full forward (the same logprobs to ~1e-6 in fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "Fidelity",
    "GrpoTerms",
    "Scored",
    "fidelity",
    "greedy_match",
    "grpo_terms",
    "shared_prefix",
    "token_logprobs",
]

# A shared prefix shorter than this is not worth its extra forward.
MIN_SHARED = 8

Tokens = Sequence[int]


class Scored(NamedTuple):
    """The policy's logprob of each response token, flat in sample order (``lengths``)."""

    logprobs: Any
    lengths: list[int]


def shared_prefix(prompts: Sequence[Tokens]) -> int:
    """How many leading tokens to run once for the whole batch (0: none).

    At most every prompt's length minus one, so the position predicting each first
    response token is run per sequence.
    """
    if len(prompts) < 2:
        return 0
    first, limit = prompts[0], min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts):
        n += 1
    return n if n >= MIN_SHARED else 0


def token_logprobs(
    model: Any,
    prompts: Sequence[Tokens],
    responses: Sequence[Tokens],
    temperature: float = 1.0,
    share_prefix: bool = True,
) -> Scored:
    """Logprob of every response token given its prompt and the response before it (of
    the distribution at ``temperature``); ``share_prefix`` False runs every sequence whole
    (for a model that will not return its key/value cache, as in a trainer's hands)."""
    import torch

    targets = torch.tensor([t for r in responses for t in r], dtype=torch.long)
    lengths = [len(r) for r in responses]
    if not len(targets):
        return Scored(torch.zeros(0), lengths)
    logits = _response_logits(model, prompts, responses, share_prefix)
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return Scored(logprobs.gather(1, targets[:, None])[:, 0], lengths)


def greedy_match(model: Any, prompts: Sequence[Tokens], targets: Sequence[Tokens]) -> list[bool]:
    """Whether greedy decoding from each prompt produces exactly its target: every target
    token is the argmax given the prompt and the target before it (one teacher-forced
    forward gives the same answer as decoding)."""
    import torch

    with torch.no_grad():
        best = _response_logits(model, prompts, targets, True).argmax(dim=-1).tolist()
    out, at = [], 0
    for target in targets:
        out.append(best[at : at + len(target)] == list(target))
        at += len(target)
    return out


def _response_logits(
    model: Any, prompts: Sequence[Tokens], responses: Sequence[Tokens], share_prefix: bool
) -> Any:
    """The logits predicting each response token, flat in sample order."""
    import torch

    shared = shared_prefix(prompts) if share_prefix else 0
    rows: list[int] = []
    cols: list[int] = []
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        start = len(prompt) - 1 - shared  # the input position predicting response[0]
        rows += [i] * len(response)
        cols += range(start, start + len(response))
    hidden = _hidden(model, _inputs(prompts, responses, shared), prompts[0][:shared])
    return model.lm_head(hidden[torch.tensor(rows), torch.tensor(cols)])


def _inputs(prompts: Sequence[Tokens], responses: Sequence[Tokens], shared: int) -> Any:
    """Input ids after the shared prefix, right-padded; a sequence's last token is only a
    target, never an input."""
    import torch

    seqs = [[*p, *r][shared:-1] for p, r in zip(prompts, responses, strict=True)]
    ids = torch.zeros((len(seqs), max(len(s) for s in seqs)), dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return ids


def _hidden(model: Any, ids: Any, prefix: Tokens) -> Any:
    """The last hidden states of ``prefix + ids[i]`` at the positions of ``ids``."""
    import torch

    batch, length = ids.shape
    positions = torch.arange(len(prefix), len(prefix) + length).expand(batch, length)
    if not prefix:
        out = model.model(input_ids=ids, position_ids=positions, use_cache=False)
        return out.last_hidden_state
    cache = model.model(input_ids=torch.tensor([list(prefix)]), use_cache=True).past_key_values
    cache.batch_repeat_interleave(batch)
    out = model.model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
    return out.last_hidden_state


class GrpoTerms(NamedTuple):
    loss: Any
    clip_frac: float
    tokens: int


def grpo_terms(
    new: Any,
    engine: Sequence[float | None],
    advantages: Sequence[float],
    mask: Sequence[int],
    clip_low: float,
    clip_high: float,
) -> GrpoTerms:
    """The clipped surrogate, averaged over the mask-1 tokens (token-level, DAPO style).

    ``new``, ``engine`` (None where the engine gave no logprob: the ratio is then 1 with
    the on-policy gradient), ``advantages`` and ``mask`` are flat, one entry per token.
    """
    import torch

    old = torch.tensor([float("nan") if x is None else x for x in engine], dtype=new.dtype)
    old = torch.where(torch.isnan(old), new.detach(), old)
    adv = torch.tensor(advantages, dtype=new.dtype)
    keep = torch.tensor(mask, dtype=torch.bool)
    ratio = torch.exp(new - old)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = -torch.minimum(ratio * adv, clipped * adv)
    tokens = int(keep.sum())
    loss = surrogate[keep].sum() / max(tokens, 1)
    was_clipped = ((adv > 0) & (ratio > 1 + clip_high)) | ((adv < 0) & (ratio < 1 - clip_low))
    clip_frac = float(was_clipped[keep].float().mean()) if tokens else 0.0
    return GrpoTerms(loss, clip_frac, tokens)


class Fidelity(NamedTuple):
    """|learner - engine| logprob over the tokens checked (None when there were none)."""

    mean: float | None
    max: float | None
    tokens: int


def fidelity(new: Any, engine: Sequence[float | None], chosen: Sequence[bool]) -> Fidelity:
    """The trainer/inference mismatch over the ``chosen`` tokens."""
    import torch

    pairs = [(i, x) for i, (x, c) in enumerate(zip(engine, chosen, strict=True)) if c]
    if not pairs:
        return Fidelity(None, None, 0)
    index = torch.tensor([i for i, _ in pairs])
    theirs = torch.tensor([x for _, x in pairs], dtype=torch.float64)
    diff = (new.detach()[index].double() - theirs).abs()
    return Fidelity(float(diff.mean()), float(diff.max()), len(pairs))
