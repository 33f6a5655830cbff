"""Which rollout server uses which LLM backends: node-local first, then balanced.

The rule, as a pure function:

1. Every server gets a quota: the backends split as evenly as possible over the
   servers (counts differ by at most one). The larger quotas go, one at a time,
   to the node whose local backends most exceed its servers' quotas so far, so
   the extra slot is one a local backend can fill.
2. Phase one: each node's backends go to that node's servers, spread evenly
   (the server with the fewest so far takes the next), up to their quotas.
3. Phase two: the backends left over (nodes with LLMs but no server, more LLMs
   than local quota) go to the servers with the fewest.

Every backend is used exactly once; with no servers at all, backends are an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prorl_async.cluster.spec import LLMEntry, ServerEntry

__all__ = ["assign"]


def assign(servers: Sequence[ServerEntry], llms: Sequence[LLMEntry]) -> dict[str, list[str]]:
    """Map each server URL to the LLM addresses it should register (see module doc)."""
    _check_unique(servers, llms)
    if llms and not servers:
        raise ValueError(f"{len(llms)} LLM backend(s) but no rollout server to assign them to")
    quotas = _quotas(servers, llms)
    out: dict[str, list[str]] = {s.url: [] for s in servers}
    leftover = _local_phase(servers, llms, quotas, out)
    for llm in leftover:
        url = min(out, key=lambda u: (len(out[u]) - quotas[u], len(out[u])))
        out[url].append(llm.address)
    return out


def _check_unique(servers: Sequence[ServerEntry], llms: Sequence[LLMEntry]) -> None:
    for kind, names in (
        ("server url", [s.url for s in servers]),
        ("LLM address", [m.address for m in llms]),
    ):
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate {kind}(s): {', '.join(dup)}")


def _quotas(servers: Sequence[ServerEntry], llms: Sequence[LLMEntry]) -> dict[str, int]:
    if not servers:
        return {}
    base, extra = divmod(len(llms), len(servers))
    quotas = {s.url: base for s in servers}
    local = _count_by_node(m.node for m in llms)
    for _ in range(extra):
        # at most one extra per server, so the counts differ by at most one
        candidates = [s for s in servers if quotas[s.url] == base]
        url = max(candidates, key=lambda s: _excess(s.node, servers, quotas, local)).url
        quotas[url] += 1
    return quotas


def _excess(
    node: str, servers: Sequence[ServerEntry], quotas: dict[str, int], local: dict[str, int]
) -> int:
    taken = sum(quotas[s.url] for s in servers if s.node == node)
    return local.get(node, 0) - taken


def _count_by_node(nodes: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    return counts


def _local_phase(
    servers: Sequence[ServerEntry],
    llms: Sequence[LLMEntry],
    quotas: dict[str, int],
    out: dict[str, list[str]],
) -> list[LLMEntry]:
    leftover = []
    for llm in llms:
        mates = [s.url for s in servers if s.node == llm.node and len(out[s.url]) < quotas[s.url]]
        if mates:
            out[min(mates, key=lambda u: len(out[u]))].append(llm.address)
        else:
            leftover.append(llm)
    return leftover
