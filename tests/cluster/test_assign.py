"""The backend assignment rule on layouts of 1-64 nodes, uneven and empty nodes."""

from __future__ import annotations

import random

import pytest

from prorl_async.cluster import LLMEntry, ServerEntry, assign


def _layout(
    servers_per_node: list[int], llms_per_node: list[int]
) -> tuple[list[ServerEntry], list[LLMEntry]]:
    servers = [
        ServerEntry(f"http://n{n}:{9000 + i}", f"n{n}")
        for n, k in enumerate(servers_per_node)
        for i in range(k)
    ]
    llms = [
        LLMEntry(f"http://n{n}:{8000 + i}/v1", f"n{n}")
        for n, k in enumerate(llms_per_node)
        for i in range(k)
    ]
    return servers, llms


def _check_rule(servers: list[ServerEntry], llms: list[LLMEntry]) -> dict[str, list[str]]:
    out = assign(servers, llms)
    node_of_server = {s.url: s.node for s in servers}
    node_of_llm = {m.address: m.node for m in llms}
    used = [a for addrs in out.values() for a in addrs]
    assert sorted(used) == sorted(node_of_llm), "every backend exactly once"
    assert list(out) == [s.url for s in servers]
    counts = [len(v) for v in out.values()]
    assert max(counts) - min(counts) <= 1, counts
    owner = {a: url for url, addrs in out.items() for a in addrs}
    for url, addrs in out.items():
        remote = [a for a in addrs if node_of_llm[a] != node_of_server[url]]
        if not remote:
            continue
        # no swap could make it more local: a backend on my node is not sent elsewhere
        for addr, node in node_of_llm.items():
            if node == node_of_server[url]:
                assert node_of_server[owner[addr]] == node, (url, addr, out)
    # on each node the local backends are spread evenly over its servers
    for node in set(node_of_server.values()):
        local = [sum(node_of_llm[a] == node for a in out[s.url]) for s in servers if s.node == node]
        assert max(local) - min(local) <= 1, (node, local)
    return out


def test_issue_layout_llmless_node_gets_remote_backends() -> None:
    servers, llms = _layout([1, 1, 1], [2, 2, 0])
    out = _check_rule(servers, llms)
    assert [len(v) for v in out.values()] == [2, 1, 1]
    n3 = out["http://n2:9000"]
    assert len(n3) == 1 and n3[0].startswith("http://n1:"), out
    assert out["http://n0:9000"] == ["http://n0:8000/v1", "http://n0:8001/v1"]


def test_node_local_split_evenly_among_node_servers() -> None:
    servers, llms = _layout([2, 2], [4, 4])
    out = _check_rule(servers, llms)
    for url, addrs in out.items():
        assert len(addrs) == 2 and all(a.split(":")[1] == url.split(":")[1] for a in addrs)


def test_llms_on_serverless_nodes_go_to_the_fewest() -> None:
    servers, llms = _layout([1, 0, 1, 0], [1, 3, 0, 2])
    out = _check_rule(servers, llms)
    assert sorted(len(v) for v in out.values()) == [3, 3]
    assert "http://n0:8000/v1" in out["http://n0:9000"]


def test_no_llms_and_fewer_llms_than_servers() -> None:
    assert assign(*_layout([2, 1], [0, 0])) == {
        "http://n0:9000": [],
        "http://n0:9001": [],
        "http://n1:9000": [],
    }
    out = _check_rule(*_layout([1, 1, 1], [0, 0, 1]))
    assert out["http://n2:9000"] == ["http://n2:8000/v1"]


def test_bad_layouts_are_named() -> None:
    with pytest.raises(ValueError, match="no rollout server"):
        assign([], [LLMEntry("http://a:1/v1", "a")])
    with pytest.raises(ValueError, match="duplicate LLM address.*http://a:1/v1"):
        assign([ServerEntry("http://s:1", "a")], [LLMEntry("http://a:1/v1", "a")] * 2)
    with pytest.raises(ValueError, match="duplicate server url"):
        assign([ServerEntry("http://s:1", "a")] * 2, [])


@pytest.mark.parametrize("seed", range(300))
def test_random_layouts_1_to_64_nodes(seed: int) -> None:
    rng = random.Random(seed)
    nodes = rng.choice([1, 2, 3, 5, 8, 16, 33, 64])
    servers_per_node = [rng.choice([0, 1, 1, 2, 4]) for _ in range(nodes)]
    if not any(servers_per_node):
        servers_per_node[rng.randrange(nodes)] = 1
    llms_per_node = [rng.choice([0, 0, 1, 2, 3, 8]) for _ in range(nodes)]
    _check_rule(*_layout(servers_per_node, llms_per_node))
