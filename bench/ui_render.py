"""How long a 32k-token trajectory page takes in a real browser (issue 43: under 2 s).

A real server (in this process) holds a ``sleep`` job whose synthetic result has 32,768
response tokens (and as many prompt tokens); headless Chromium (tests/ui/browser.py)
opens ``/ui/jobs/{id}`` ``--runs`` times. Per run, from the browser's navigation
timing: the server's answer (request start to last byte), DOM content loaded and the
load event (from navigation start), the next frame after it (the whole page laid
out) and the first contentful paint; plus the page's
size and its number of token elements.

    python -m bench.ui_render [--tokens 32768] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

import aiohttp

from prorl_async.api.app import run_server
from prorl_async.config import load_config
from tests.ui.browser import Chromium

_TIMING = """(() => {
  const n = performance.getEntriesByType('navigation')[0];
  const p = performance.getEntriesByName('first-contentful-paint')[0];
  return {server: n.responseEnd - n.requestStart, dom: n.domContentLoadedEventEnd,
          load: n.loadEventEnd, fcp: p ? p.startTime : null, bytes: n.transferSize,
          tokens: document.querySelectorAll('.strip .t').length};
})()"""
# The next frame after the load event, the whole page laid out (an upper bound: the
# evaluation starts when the poll for the load event sees it, within ~50 ms).
_PAINTED = """new Promise(done => requestAnimationFrame(() => {
  document.body.getBoundingClientRect(); setTimeout(() => done(performance.now()));
}))"""


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(overrides={"port": 0, "store": "memory"}, env={})
        async with run_server(cfg) as (_, url), aiohttp.ClientSession() as s:
            body = {"task": "sleep", "instance": {"result_tokens": 2 * args.tokens}}
            async with s.post(f"{url}/process", json=body) as r:
                job_id = (await r.json())["job_id"]
            async with s.get(f"{url}/jobs/{job_id}?wait=60") as r:
                assert r.status == 200
            async with Chromium(Path(tmp) / "chromium") as browser:
                page = await browser.new_page()
                rows = []
                for _ in range(args.runs):
                    await page.goto(f"{url}/ui/jobs/{job_id}")
                    await page.wait_for(
                        "performance.getEntriesByType('navigation')[0].loadEventEnd > 0"
                    )
                    t = await page.evaluate(_TIMING)
                    t["painted"] = await page.evaluate(_PAINTED)
                    rows.append(t)
                    print(
                        f"server {t['server']:6.0f} ms  DOM loaded {t['dom']:6.0f} ms  "
                        f"load {t['load']:6.0f} ms  laid out {t['painted']:6.0f} ms  "
                        f"first paint {t['fcp'] or 0:6.0f} ms  "
                        f"{t['bytes'] / 1e6:.1f} MB  {t['tokens']} token elements"
                    )
    for key in ("server", "dom", "load", "painted"):
        print(f"median {key}: {statistics.median(r[key] for r in rows):.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
