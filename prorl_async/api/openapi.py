"""OpenAPI 3 document of the HTTP routes, with schemas generated from the msgspec structs."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from prorl_async.llm.sampling import SamplingParams
from prorl_async.schemas import (
    AddLLMServerRequest,
    BatchRequest,
    BatchResponse,
    CallbackInfo,
    CancelRequest,
    CancelResponse,
    JobStatusResponse,
    PollRequest,
    PollResponse,
    Problem,
    ProcessRequest,
    RemoveLLMServerRequest,
    ResultDoc,
    ResultsResponse,
    StatusResponse,
    SubmitResponse,
    WeightsLoadRequest,
    WeightsPauseRequest,
    WeightsResumeRequest,
    WorkersRequest,
)
from prorl_async.util.version import __version__

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"
_TYPES: list[Any] = [
    ProcessRequest,
    SamplingParams,
    BatchRequest,
    PollRequest,
    CancelRequest,
    AddLLMServerRequest,
    RemoveLLMServerRequest,
    WorkersRequest,
    WeightsPauseRequest,
    WeightsResumeRequest,
    WeightsLoadRequest,
    SubmitResponse,
    BatchResponse,
    JobStatusResponse,
    ResultDoc,
    ResultsResponse,
    CallbackInfo,
    PollResponse,
    CancelResponse,
    StatusResponse,
    Problem,
]


def _ref(t: type[Any]) -> dict[str, Any]:
    return {"$ref": _REF.format(name=t.__name__)}


def _body(t: type[Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(t)}}}


def _resp(desc: str, t: type[Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": desc}
    if t is not None:
        out["content"] = {"application/json": {"schema": _ref(t)}}
    return out


_PROBLEM = {
    "description": "problem+json error",
    "content": {"application/problem+json": {"schema": _ref(Problem)}},
}


def _op(summary: str, body: type[Any] | None, responses: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**responses, "default": _PROBLEM}}
    if body is not None:
        op["requestBody"] = _body(body)
    return op


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_WAIT = {
    "name": "wait",
    "in": "query",
    "required": False,
    "schema": {"type": "number", "minimum": 0},
}


def _paths() -> dict[str, Any]:
    backends = _resp("the backend list")
    return {
        "/process": {
            "post": _op(
                "Submit one rollout",
                ProcessRequest,
                {
                    "202": _resp("queued", SubmitResponse),
                    "200": _resp("already known", SubmitResponse),
                },
            )
        },
        "/process/batch": {
            "post": _op(
                "Submit many rollouts", BatchRequest, {"202": _resp("queued", BatchResponse)}
            )
        },
        "/jobs/{job_id}": {
            "get": {
                **_op(
                    "Long-poll one job",
                    None,
                    {
                        "200": _resp("terminal result", ResultDoc),
                        "202": _resp("not finished yet", JobStatusResponse),
                    },
                ),
                "parameters": [_JOB_ID, _WAIT],
            },
            "delete": {
                **_op("Forget a job (cancelling it first)", None, {"204": _resp("deleted")}),
                "parameters": [_JOB_ID],
            },
        },
        "/poll": {
            "post": _op(
                "Long-poll many jobs",
                PollRequest,
                {"200": _resp("done/pending/unknown", PollResponse)},
            )
        },
        "/cancel": {
            "post": _op(
                "Cancel jobs",
                CancelRequest,
                {"200": _resp("what happened to each id", CancelResponse)},
            )
        },
        "/add_llm_server": {
            "post": _op("Register or update an LLM backend", AddLLMServerRequest, {"200": backends})
        },
        "/remove_llm_server": {
            "post": _op("Remove an LLM backend", RemoveLLMServerRequest, {"200": backends})
        },
        "/clear_llm_server": {"post": _op("Remove every LLM backend", None, {"200": backends})},
        "/start": {
            "post": _op("Accept jobs again", None, {"200": _resp("status", StatusResponse)})
        },
        "/stop": {
            "post": _op(
                "Cancel all jobs, refuse new ones", None, {"200": _resp("status", StatusResponse)}
            )
        },
        "/status": {"get": _op("Server status", None, {"200": _resp("status", StatusResponse)})},
        "/workers": {
            "post": _op(
                "Resize stage worker pools (a shrink never cancels a job)",
                WorkersRequest,
                {"200": _resp("status", StatusResponse)},
            )
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                None,
                {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            )
        },
        "/weights": {"get": _op("Weight version per backend", None, {"200": _resp("backends")})},
        "/weights/pause": {
            "post": _op(
                "Pause generation on the engines for a weight update",
                WeightsPauseRequest,
                {"200": _resp("paused backends, interrupted generations")},
            )
        },
        "/weights/resume": {
            "post": _op(
                "Resume the engines (tokens from now on carry the version)",
                WeightsResumeRequest,
                {"200": _resp("resumed backends")},
            )
        },
        "/weights/load": {
            "post": _op(
                "Pause, load a checkpoint on every engine in place, resume with a version",
                WeightsLoadRequest,
                {"200": _resp("per-backend load results")},
            )
        },
        **_result_paths(),
        "/healthz": {"get": _op("Liveness", None, {"200": _resp("alive")})},
        "/openapi.json": {"get": _op("This document", None, {"200": _resp("OpenAPI 3")})},
    }


def _query(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _result_paths() -> dict[str, Any]:
    seq = {"type": "integer", "minimum": 0, "maximum": 2**62}
    stream = {
        "description": "text/event-stream: one `event: job` per terminal job, `id:` its seq",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
    return {
        "/results": {
            "get": {
                **_op(
                    "Terminal jobs' results after a cursor, in completion order",
                    None,
                    {"200": _resp("results and the next cursor", ResultsResponse)},
                ),
                "parameters": [
                    _query("after", seq),
                    _query("limit", {"type": "integer", "minimum": 0, "maximum": 10_000}),
                    _WAIT,
                ],
            }
        },
        "/events": {
            "get": {
                **_op("Server-Sent Events of terminal jobs", None, {"200": stream}),
                "parameters": [_query("after", seq)],
            }
        },
        "/jobs/{job_id}/callback": {
            "get": {
                **_op(
                    "The callback delivery of a job", None, {"200": _resp("state", CallbackInfo)}
                ),
                "parameters": [_JOB_ID],
            }
        },
    }


def _one_field(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: schema},
        "required": [name],
        "additionalProperties": False,
    }


def _tighten(components: dict[str, Any], tasks: tuple[str, ...]) -> None:
    # What the structs cannot say: the registered tasks, the checked sampling_params
    # (validated at submit, 422) and /cancel's either-or body.
    process = components["ProcessRequest"]["properties"]
    if tasks:
        process["task"]["enum"] = list(tasks)
    process["sampling_params"] = {**_ref(SamplingParams), "default": {}}
    ids = {"type": "array", "items": {"type": "string"}}
    components["CancelRequest"] = {
        "title": "CancelRequest",
        "oneOf": [_one_field("job_id", {"type": "string"}), _one_field("job_ids", ids)],
    }


@functools.cache
def openapi_document(tasks: tuple[str, ...] = ()) -> dict[str, Any]:
    """The document; ``tasks`` (the registered task names) become the ``task`` enum."""
    _, components = msgspec.json.schema_components(_TYPES, ref_template=_REF)
    _tighten(components, tasks)
    return {
        "openapi": "3.1.0",
        "info": {"title": "prorl-async", "version": __version__},
        "paths": _paths(),
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
