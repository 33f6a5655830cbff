"""Group filters: which complete groups teach the policy something."""

from __future__ import annotations

from collections.abc import Callable

from prorl_async.trainer.group import Group

__all__ = ["FILTERS", "GroupFilter", "resolve_filter"]

GroupFilter = Callable[[Group], bool]


def keep_all(group: Group) -> bool:
    return True


def nonzero_std(group: Group) -> bool:
    """DAPO dynamic sampling: drop a group whose rewards are all equal (zero advantage)."""
    rewards = [r for r in group.rewards if r is not None]
    return len(set(rewards)) > 1


FILTERS: dict[str, GroupFilter] = {"nonzero_std": nonzero_std, "none": keep_all}


def resolve_filter(spec: str | GroupFilter | None) -> GroupFilter:
    """``None``, a name from ``FILTERS`` or a callable ``(Group) -> bool``."""
    if spec is None:
        return keep_all
    if callable(spec):
        return spec
    try:
        return FILTERS[spec]
    except KeyError:
        raise ValueError(
            f"group_filter: unknown filter {spec!r}; "
            f"use None, a callable or one of {sorted(FILTERS)}"
        ) from None
