"""The OpenAPI document states the real constraints, so schema fuzzing exercises them."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.helpers import ServerFactory


async def _openapi(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/openapi.json") as r:
        doc: dict[str, Any] = await r.json()
        return doc


async def test_openapi_states_bounds_enums_and_one_of(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        doc = await _openapi(srv.url)
        schemas = doc["components"]["schemas"]
        process = schemas["ProcessRequest"]["properties"]
        assert process["task"]["enum"] == srv.service.registry.names()
        assert "blocking" in process["task"]["enum"] and "sleep" in process["task"]["enum"]
        assert process["timeout_s"]["anyOf"][0]["exclusiveMinimum"] == 0
        assert process["sampling_params"]["$ref"].endswith("/SamplingParams")
        sampling = schemas["SamplingParams"]
        assert sampling["additionalProperties"] is False
        assert sampling["properties"]["max_tokens"] == {"type": "integer", "minimum": 1}
        assert sampling["properties"]["top_p"]["exclusiveMinimum"] == 0
        wait = doc["paths"]["/jobs/{job_id}"]["get"]["parameters"][1]
        assert wait["name"] == "wait" and wait["schema"]["minimum"] == 0
        assert schemas["PollRequest"]["properties"]["wait"]["minimum"] == 0
        cancel = schemas["CancelRequest"]["oneOf"]
        assert [c["required"] for c in cancel] == [["job_id"], ["job_ids"]]


async def test_cancel_takes_one_of_job_id_or_job_ids(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        job = await srv.client.submit("blocking", {"block": ["run"]})
        async with aiohttp.ClientSession() as s:
            body = {"job_id": job, "job_ids": [job]}
            async with s.post(f"{srv.url}/cancel", json=body) as r:
                assert r.status == 400 and "not both" in (await r.json())["detail"]
            async with s.post(f"{srv.url}/cancel", json={"job_ids": [job]}) as r:
                assert r.status == 200 and (await r.json())["cancelled"] == [job]
