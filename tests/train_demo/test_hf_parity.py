"""Hugging Face loads the task tokenizer as vLLM does, and agrees with the server on every id.

``transformers.AutoTokenizer`` runs in the engine's venv (a subprocess): it must encode the
rendered prompts and answers to the server's ids, decode ids to the server's text, and render
the math prompt with the same chat template text.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from prorl_async.llm.tokenizer import ChatTokenizer
from prorl_async.train_demo.prompt import prompt_messages, prompt_text, prompt_tools
from prorl_async.train_demo.task import answer_text, held_out_problems, problems
from prorl_async.vllm_cpu import EngineEnv

# transformers' import alone takes ~10 s on 2 cores.
pytestmark = pytest.mark.timeout(300)

_HF_SCRIPT = """\
import json, sys
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained(sys.argv[1])
cases = json.load(open(sys.argv[2]))
out = {
    "class": type(tok).__name__,
    "len": len(tok),
    "specials": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id],
    "ids": [tok.encode(t, add_special_tokens=False) for t in cases["texts"]],
    "ids_default": [tok(t)["input_ids"] for t in cases["texts"]],
    "decoded": [tok.decode(ids) for ids in cases["ids"]],
    "chat": [
        tok.apply_chat_template(
            c["messages"], tools=c["tools"], add_generation_prompt=True, tokenize=False
        )
        for c in cases["chats"]
    ],
}
json.dump(out, open(sys.argv[3], "w"))
"""


def _texts() -> list[str]:
    pairs = problems(5, 40) + list(held_out_problems()[:10])
    texts = [prompt_text(a, b) for a, b in pairs]
    texts += [answer_text(a, b) + "<|im_end|>" for a, b in pairs]
    return texts + [
        "<tool_call>\n"
        + json.dumps({"name": "finish", "arguments": {"answer": "42"}})
        + "\n</tool_call>",
        "Hello, world! déjà vu e\u0301 東京 🎉\r\n\tcode = [1, 2, 3]",
        "<|im_start|>user\n<tool_response>\nOut[1]: 4\n</tool_response><|im_end|>\n",
    ]


def _hf_answers(env: EngineEnv, tok_dir: Path, cases: dict[str, Any], tmp: Path) -> Any:
    (tmp / "cases.json").write_text(json.dumps(cases))
    (tmp / "hf.py").write_text(_HF_SCRIPT)
    run_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    run_env.pop("PYTHONPATH", None)
    args = [str(env.python), "hf.py", str(tok_dir), "cases.json", "out.json"]
    subprocess.run(args, cwd=tmp, env=run_env, check=True, timeout=240)
    return json.loads((tmp / "out.json").read_text())


def test_hugging_face_agrees_with_the_server(
    engine_env: EngineEnv, task_tok_dir: Path, task_tok: ChatTokenizer, tmp_path: Path
) -> None:
    texts = _texts()
    ours = [task_tok.encode(t) for t in texts]
    chats = [{"messages": prompt_messages(a, b), "tools": prompt_tools()} for a, b in [(3, 94)]]
    cases = {"texts": texts, "ids": ours, "chats": chats}
    hf = _hf_answers(engine_env, task_tok_dir, cases, tmp_path)
    assert hf["len"] == task_tok.vocab_size
    im_end, pad = task_tok.encode("<|im_end|>")[0], task_tok.encode("<|endoftext|>")[0]
    assert hf["specials"] == [None, im_end, pad]
    assert hf["ids"] == ours
    assert hf["ids_default"] == ours
    assert hf["decoded"] == [task_tok.decode(ids) for ids in ours] == texts
    assert hf["chat"] == [prompt_text(3, 94)]
