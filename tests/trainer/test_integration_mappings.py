"""The veRL and slime mappings (``to_verl``/``to_slime``) against each framework's own
field list, against docs/integrations.md's tables, and on a multi-turn result."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prorl_async import client as client_module
from prorl_async.trainer import Group
from prorl_async.trainer import group as group_module
from prorl_async.trainer.group import generated_tokens, slime_status, to_slime, to_verl

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
API = ROOT / "docs" / "API.md"

# veRL: verl/experimental/agent_loop/agent_loop.py at volcengine/verl
# b178a3cd56f58b2d502255daba591e92833930a7 (version 0.8.0.dev), in declaration order.
VERL_AGENT_LOOP_OUTPUT_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_mask",
    "response_logprobs",
    "routed_experts",
    "multi_modal_data",
    "reward_score",
    "num_turns",
    "metrics",
    "extra_fields",
)
# The AgentLoopOutput fields without a default (same file and commit).
VERL_REQUIRED_FIELDS = ("prompt_ids", "response_ids", "response_mask", "metrics")
# class AgentLoopMetrics, the type of AgentLoopOutput.metrics (same file and commit).
VERL_AGENT_LOOP_METRICS_FIELDS = ("generate_sequences", "tool_calls", "num_preempted")
# What to_verl adds beyond AgentLoopOutput (docs/integrations.md says so).
OUR_VERL_EXTRAS = {"response_versions"}

# slime: slime/utils/types.py at THUDM/slime 624b824a898ab0ec1fcb4d373004c7f3852bf515
# (setup.py version 0.3.1): the dataclass Sample's fields in declaration order (every one
# has a default), and the values of its enum Sample.Status.
SLIME_SAMPLE_FIELDS = (
    "group_index",
    "index",
    "rollout_id",
    "prompt",
    "tokens",
    "multimodal_inputs",
    "multimodal_train_inputs",
    "multimodal_train_input_id",
    "apply_chat_template_kwargs",
    "response",
    "response_length",
    "label",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "rollout_routed_experts",
    "remove_sample",
    "teacher_log_probs",
    "status",
    "metadata",
    "generate_function_path",
    "custom_rm_path",
    "train_metadata",
    "session_id",
    "non_generation_time",
    "spec_info",
    "prefix_cache_info",
)
SLIME_STATUS_VALUES = ("pending", "completed", "truncated", "aborted", "failed")

PROMPT = [151644, 8948, 198, 2610, 525, 264, 151645, 198, 151644, 872, 198, 3838, 151645]


Turn = tuple[dict[str, Any], list[int | None]]


def assistant(ids: list[int], logprobs: list[float], versions: list[int | None], text: str) -> Turn:
    """An assistant turn and the weight version of each of its tokens."""
    turn = {"role": "assistant", "token_ids": ids, "logprobs": logprobs, "text": text}
    return turn, versions


def multi_turn_result(status: str = "done", finish: str | None = "finish_tool") -> dict[str, Any]:
    """A two-call rollout: model, tool observation, model again across a weight update
    (version 7 -> 8 inside the second turn), the way the service builds it."""
    turns: list[Turn] = [
        assistant([40, 1184, 311, 11047, 13], [-0.3, -0.01, -1.2, -0.5, -0.02], [7] * 5, "I call"),
        (
            {"role": "tool", "token_ids": [151644, 14172, 198, 19, 17, 151645], "text": "<obs>42"},
            [None] * 6,
        ),
        assistant(
            [785, 4226, 374, 220, 19, 17],
            [-0.1, -0.4, -0.2, -0.9, -0.05, -0.3],
            [7, 7, 7, 8, 8, 8],
            " 42.",
        ),
    ]
    response_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    versions: list[int | None] = []
    for turn, turn_versions in turns:
        ids = turn["token_ids"]
        model = turn["role"] == "assistant"
        response_ids += ids
        mask += [1 if model else 0] * len(ids)
        logprobs += turn["logprobs"] if model else [0.0] * len(ids)
        versions += turn_versions
    return {
        "job_id": "run-p3-1-0",
        "task": "math",
        "status": status,
        "reward": 1.0 if status == "done" else None,
        "prompt_ids": list(PROMPT),
        "response_ids": response_ids,
        "response_mask": mask,
        "response_logprobs": logprobs,
        "response_versions": versions,
        "num_turns": 2,
        "turns": [turn for turn, _ in turns],
        "weight_versions": [7, 8],
        "finish": finish,
        "error": None,
        "timing": {"queued_s": 0.1, "run_s": 3.2, "active_s": 3.4},
        "eval": {},
        "metadata": {"prorl_trainer": {"prompt_uid": "p3", "sample": 1}},
        "restarts": 0,
        "seq": 12,
    }


# -- field names against each framework ----------------------------------------------------


def test_verl_keys_are_agent_loop_output_fields() -> None:
    row = to_verl(multi_turn_result())
    assert set(row) - OUR_VERL_EXTRAS <= set(VERL_AGENT_LOOP_OUTPUT_FIELDS)
    assert set(VERL_REQUIRED_FIELDS) <= set(row)  # all four are ours to fill
    assert not OUR_VERL_EXTRAS & set(VERL_AGENT_LOOP_OUTPUT_FIELDS)


def test_verl_metrics_are_ours_not_agent_loop_metrics() -> None:
    # docs/integrations.md tells users to move them into extra_fields because veRL's
    # AgentLoopMetrics would drop them; this holds while the keys are disjoint.
    metrics = to_verl(multi_turn_result())["metrics"]
    assert set(metrics) == {"status", "timing", "weight_versions", "job_id"}
    assert not set(metrics) & set(VERL_AGENT_LOOP_METRICS_FIELDS)


def test_slime_keys_are_sample_fields() -> None:
    for status in ("done", "failed", "cancelled", "timed_out"):
        row = to_slime(multi_turn_result(status))
        assert set(row) <= set(SLIME_SAMPLE_FIELDS), set(row) - set(SLIME_SAMPLE_FIELDS)
        assert row["status"] in SLIME_STATUS_VALUES


def test_group_views_are_one_per_sample_in_order() -> None:
    results = [multi_turn_result(), multi_turn_result("timed_out")]
    results[1]["job_id"] = "run-p3-1-1"
    group = Group("p3", {"task": "math"}, results)
    assert group.to_slime() == [to_slime(r) for r in results]
    assert group.to_verl() == [to_verl(r) for r in results]
    ids = [row["metadata"]["prorl_async"]["job_id"] for row in group.to_slime()]
    assert ids == ["run-p3-1-0", "run-p3-1-1"]


# -- docs/integrations.md's tables name exactly what the code fills -----------------------


def section(title: str) -> str:
    text = DOC.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {title}' in {DOC}"
    return match.group(1)


def table(text: str, header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table whose first header cell is ``header``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == header:
            assert set(lines[i + 1].replace("|", "").strip()) <= {"-", ":"}, lines[i + 1]
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([c.strip() for c in row.strip().strip("|").split("|")])
            return rows
    raise AssertionError(f"no table headed {header!r}")


def names(cell: str) -> list[str]:
    return re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cell)


def first_column(text: str, header: str) -> list[str]:
    return [n for row in table(text, header) for n in names(row[0])]


@pytest.mark.parametrize(
    ("title", "header", "unfilled_header", "framework", "extras", "produced"),
    [
        (
            "veRL",
            "`AgentLoopOutput` field",
            "`AgentLoopOutput` field not filled",
            VERL_AGENT_LOOP_OUTPUT_FIELDS,
            OUR_VERL_EXTRAS,
            lambda: to_verl(multi_turn_result()),
        ),
        (
            "slime",
            "`Sample` field",
            "`Sample` field not filled",
            SLIME_SAMPLE_FIELDS,
            set(),
            lambda: to_slime(multi_turn_result()),
        ),
    ],
)
def test_doc_tables_name_the_fields_the_code_fills(
    title: str,
    header: str,
    unfilled_header: str,
    framework: tuple[str, ...],
    extras: set[str],
    produced: Callable[[], dict[str, Any]],
) -> None:
    text = section(title)
    filled = table(text, header)
    # one field per row, named first in its cell
    mapped = [names(row[0])[0] for row in filled]
    assert len(mapped) == len(set(mapped))
    assert set(mapped) == set(produced())
    unfilled = first_column(text, unfilled_header)
    assert len(unfilled) == len(set(unfilled))
    assert not set(unfilled) & set(mapped)
    # every framework field is either filled or said not to be, and nothing else is named
    assert set(mapped) | set(unfilled) == set(framework) | extras
    for extra in extras:
        (row,) = [r for r in filled if names(r[0])[0] == extra]
        assert "ours" in row[0]


def test_doc_names_the_commits_the_field_lists_come_from() -> None:
    source = Path(__file__).read_text()
    for title in ("veRL", "slime"):
        (commit,) = re.findall(r"commit `([0-9a-f]{40})`", section(title))
        assert commit in source


def terminal_statuses() -> list[str]:
    """The terminal status values docs/API.md lists."""
    match = re.search(r"^(.*)\(terminal\)", API.read_text(), re.M)
    assert match, "no terminal status list in docs/API.md"
    return names(match.group(1))


def test_doc_status_table_is_what_slime_status_does() -> None:
    rows = table(section("slime"), "our `status`")
    covered = set()
    for status_cell, finish_cell, value_cell in rows:
        (status,) = names(status_cell)
        (value,) = names(value_cell)
        assert value in SLIME_STATUS_VALUES
        finishes: list[str | None] = list(names(finish_cell))
        if not finishes:  # "any" / "any other": whatever the run loop may end with
            finishes = [None, "finish_tool", "no_tool_call", "max_turns"]
            if status != "done":
                finishes += ["length", "context_exhausted"]
        for finish in finishes:
            result = multi_turn_result(status, finish)
            assert slime_status(result) == value, (status, finish)
            assert to_slime(result)["status"] == value
        covered.add(status)
    assert covered == set(terminal_statuses())


@pytest.mark.parametrize("status", ["queued_init", "run", "eval", None, "lost"])
def test_a_job_that_has_not_ended_has_no_slime_status(status: str | None) -> None:
    result = multi_turn_result()
    result["status"] = status
    with pytest.raises(ValueError, match="has not ended"):
        to_slime(result)


def test_doc_recipes_parse_and_use_names_that_exist() -> None:
    modules = {"prorl_async.client": client_module, "prorl_async.trainer.group": group_module}
    for title, hook in (("veRL", "to_verl"), ("slime", "to_slime")):
        (code,) = re.findall(r"```python\n(.*?)```", section(title), re.S)
        tree = ast.parse(code)
        imported = {
            (node.module, alias.name)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module in modules
            for alias in node.names
        }
        assert ("prorl_async.trainer.group", hook) in imported
        for module, name in imported:
            assert hasattr(modules[module], name), (module, name)
        calls = {
            node.func.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "client"
        }
        assert calls == {"submit", "result"}
        assert all(hasattr(client_module.RolloutClient, c) for c in calls)


# -- values on a multi-turn result --------------------------------------------------------


def test_slime_values_on_a_multi_turn_result() -> None:
    result = multi_turn_result()
    row = to_slime(result)
    n = len(result["response_ids"])
    assert row["tokens"] == PROMPT + result["response_ids"]
    assert (
        row["tokens"][: len(PROMPT)] == PROMPT
        and row["tokens"][len(PROMPT) :] == result["response_ids"]
    )
    assert row["response_length"] == n == len(row["loss_mask"]) == len(row["rollout_log_probs"])
    assert len(row["tokens"]) == len(PROMPT) + row["response_length"]
    assert row["loss_mask"] == result["response_mask"]
    assert 0 in row["loss_mask"] and sum(row["loss_mask"]) == generated_tokens(result) == 11
    assert row["rollout_log_probs"] == result["response_logprobs"]
    assert all(
        lp == 0.0 for lp, m in zip(row["rollout_log_probs"], row["loss_mask"], strict=True) if not m
    )
    assert row["reward"] == 1.0
    assert row["status"] == "completed"
    assert row["weight_versions"] == ["7", "8"]
    assert row["response"] == "I call<obs>42 42."
    ours = row["metadata"]["prorl_async"]
    assert ours["response_versions"] == result["response_versions"]
    assert len(ours["response_versions"]) == n
    assert (ours["job_id"], ours["status"], ours["num_turns"]) == ("run-p3-1-0", "done", 2)
    assert ours["timing"] == result["timing"]
    # the lists are the row's own: filling a Sample from it cannot change the result
    row["loss_mask"][0] = 0
    row["tokens"].append(0)
    assert result["response_mask"][0] == 1 and result["prompt_ids"] == PROMPT


def test_slime_values_of_a_result_without_a_reward() -> None:
    row = to_slime(multi_turn_result("timed_out", finish=None))
    assert row["reward"] is None and row["status"] == "truncated"
    assert row["response_length"] == len(row["loss_mask"])


def test_verl_values_on_a_multi_turn_result() -> None:
    result = multi_turn_result()
    row = to_verl(result)
    n = len(result["response_ids"])
    assert row["prompt_ids"] == PROMPT
    assert row["response_ids"] == result["response_ids"]
    assert row["response_mask"] == result["response_mask"] and 0 in row["response_mask"]
    assert row["response_logprobs"] == result["response_logprobs"]
    assert len(row["response_mask"]) == len(row["response_logprobs"]) == n
    assert len(row["response_versions"]) == n
    assert [
        v for v, m in zip(row["response_versions"], row["response_mask"], strict=True) if not m
    ] == [None] * 6
    assert row["reward_score"] == 1.0 and row["num_turns"] == 2
    assert row["metrics"] == {
        "status": "done",
        "timing": result["timing"],
        "weight_versions": [7, 8],
        "job_id": "run-p3-1-0",
    }
