"""The README's Python snippet runs as written, against a real server and the scripted LLM."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from prorl_async.scripted_llm import ScriptedLLM
from tests.helpers import ServerFactory

README = Path(__file__).resolve().parents[1] / "README.md"


def _client_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    snippet: str
    (snippet,) = [b for b in blocks if "RolloutClient(" in b and "asyncio.run(" in b]
    return snippet


async def test_the_python_snippet_polls_every_job_to_the_end(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    snippet = _client_snippet()
    async with ScriptedLLM(policy="finish") as llm, make_server(runtime="local") as srv:
        # Only the two addresses change: the server's and the LLM's ports are free ones.
        code = snippet.replace("http://127.0.0.1:8400", srv.url)
        code = code.replace("http://127.0.0.1:8000/v1", llm.address)
        assert code.count(srv.url) == 1 and code.count(llm.address) == 1, code
        script = tmp_path / "snippet.py"
        script.write_text(code)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(90):
            out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    problems = snippet.count('("What is')
    assert len(lines) == problems >= 3, lines  # every job, not only the first done
    for line in lines:
        job_id, status, reward, n_ids = line.split()
        assert job_id.startswith("j-") and status == "done" and int(n_ids) > 0, line
    # The scripted LLM answers 42: the one problem whose answer that is scores 1.
    assert sorted(float(line.split()[2]) for line in lines) == [0.0] * (problems - 1) + [1.0]
