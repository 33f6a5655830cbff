"""A minimal trainer (a TEST DOUBLE for ``prorl-async collect --cluster``).

Reads ``$PRORL_CLUSTER``, submits ``N`` math rollouts spread over every rollout server,
waits for all results and writes them as JSON lines to ``OUT``:
``python -m tests.cluster.trainer_double N OUT``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from prorl_async.client import RolloutClient
from prorl_async.cluster import load_spec


async def _collect(url: str, count: int, token: str | None) -> list[dict[str, Any]]:
    async with RolloutClient(url, token=token) as client:
        jobs = [{"task": "math", "instance": {"problem": f"What is {i} + 1?", "answer": str(i + 1)},
                 "sampling_params": {"max_tokens": 16}, "metadata": {"server": url}}
                for i in range(count)]  # fmt: skip
        ids = await client.submit_batch(jobs)
        results: list[dict[str, Any]] = []
        pending = ids
        while pending:
            out = await client.poll(pending, wait=10)
            results += out["done"]
            pending = out["pending"]
        return results


async def _main(total: int, out: str) -> int:
    with open(os.environ["PRORL_CLUSTER"], "rb") as f:
        spec = load_spec(f.read())
    token = os.environ.get("PRORL_TOKEN")
    n = len(spec.servers)
    shares = [total // n + (i < total % n) for i in range(n)]
    batches = await asyncio.gather(*(_collect(s.url, k, token)
                                     for s, k in zip(spec.servers, shares, strict=True)))  # fmt: skip
    with open(out, "w") as f:
        for result in (r for batch in batches for r in batch):
            f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(_main(int(sys.argv[1]), sys.argv[2])))
