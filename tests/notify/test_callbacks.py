"""Callbacks: signed POSTs of result documents, retried from a durable outbox."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from prorl_async.client import RolloutClient, UnprocessableError
from prorl_async.config import ConfigError, load_config
from prorl_async.notify import sign, verify
from tests.helpers import ServerFactory, eventually, free_port, server_process
from tests.notify.receiver import receiver

SECRET = "s3cret"
FAST = {"backoff_s": 0.02, "max_backoff_s": 0.1, "retry_for_s": 600.0}


def _callbacks(**extra: Any) -> dict[str, Any]:
    return {"allow_hosts": ["127.0.0.1", "*.example.org"], "secret": SECRET, **FAST, **extra}


def _job(port: int) -> dict[str, Any]:
    return {"task": "sleep", "instance": {}, "callback_url": f"http://127.0.0.1:{port}/hook"}


async def _summary(c: RolloutClient) -> dict[str, Any]:
    out: dict[str, Any] = (await c.status())["callbacks"]
    return out


async def _state(url: str, job_id: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/jobs/{job_id}/callback") as r:
        assert r.status == 200, await r.text()
        out: dict[str, Any] = await r.json()
        return out


def test_signature_is_hmac_sha256_of_the_body() -> None:
    header = sign(b"k", b'{"a":1}')
    assert header == "sha256=" + __import__("hmac").new(b"k", b'{"a":1}', "sha256").hexdigest()
    assert verify(b"k", b'{"a":1}', header) and not verify(b"k", b'{"a":2}', header)


def test_allow_hosts_without_a_secret_is_a_clear_config_error() -> None:
    with pytest.raises(ConfigError, match="no secret to sign with"):
        load_config(overrides={"callbacks": {"allow_hosts": ["h"]}}, env={})
    cfg = load_config(
        overrides={"callbacks": {"allow_hosts": ["h"]}}, env={"PRORL_CALLBACK_SECRET": "e"}
    )
    assert cfg.callbacks.secret == "e"


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("http://10.0.0.1/hook", "host '10.0.0.1' is not in the server's callbacks.allow_hosts"),
        ("http://metadata.google.internal/", "is not in the server's callbacks.allow_hosts"),
        ("ftp://127.0.0.1/hook", "expected an http(s) URL with a host"),
        ("http://u:p@127.0.0.1/hook", "credentials in the URL are not accepted"),
        ("http://127.0.0.1:99999/hook", "not a valid URL"),
    ],
)
async def test_a_callback_url_outside_the_allowlist_is_refused(
    make_server: ServerFactory, url: str, detail: str
) -> None:
    async with make_server(callbacks=_callbacks()) as srv:
        c = srv.client
        with pytest.raises(UnprocessableError) as info:
            await c.submit("sleep", {}, callback_url=url)
        assert info.value.detail.startswith("callback_url: ") and detail in info.value.detail
        with pytest.raises(UnprocessableError, match=r"jobs\[1\]\.callback_url: "):
            await c.submit_batch([{"task": "sleep"}, {"task": "sleep", "callback_url": url}])
        assert len(srv.service.store) == 0  # nothing was created
        # a pattern: *.example.org
        await c.submit("sleep", {}, callback_url="https://a.example.org/hook")


async def test_callbacks_are_off_without_an_allowlist(make_server: ServerFactory) -> None:
    async with make_server() as srv:
        with pytest.raises(UnprocessableError, match="callbacks are off on this server"):
            await srv.client.submit("sleep", {}, callback_url="http://127.0.0.1/hook")


async def test_a_receiver_down_then_up_gets_every_result_signed(
    make_server: ServerFactory,
) -> None:
    port = free_port()
    async with make_server(callbacks=_callbacks()) as srv:
        c = srv.client
        ids = await c.submit_batch([_job(port)] * 20)

        async def tried_while_down() -> bool:  # every one once, then probes of the host
            s = await _summary(c)
            return bool(s["pending"] == 20 and s["attempts"] >= 20 + 3)

        await eventually(tried_while_down, timeout=60)
        async with receiver(SECRET.encode(), port) as (rec, _):
            await eventually(lambda: set(rec.delivered()) == set(ids), timeout=60)
            assert all(signed for _, _, signed, _ in rec.posts)
            for job_id, body in rec.delivered().items():
                async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/jobs/{job_id}") as r:
                    assert await r.read() == body  # the result document, byte for byte
            summary = await _summary(c)
            assert summary["pending"] == 0 and summary["delivered"] >= 20
            await eventually(lambda: _delivered(srv.url, ids[0]))  # once committed
            state = await _state(srv.url, ids[0])
            assert state["attempts"] >= 1 and state["url"] == f"http://127.0.0.1:{port}/hook"


async def test_a_receiver_answering_500_forever_fails_at_the_limit_and_slows_nothing(
    make_server: ServerFactory,
) -> None:
    async with receiver(SECRET.encode()) as (rec, port):
        rec.status = 500
        async with make_server(callbacks=_callbacks(retry_for_s=1.0)) as srv:
            c = srv.client
            hooked = await c.submit_batch([_job(port)] * 200)
            await c.submit_batch([{"task": "sleep", "instance": {}}] * 300)
            # the pipeline does not wait for deliveries: every job ends while they fail
            await eventually(lambda: srv.service.store.counts()["done"] == 500)

            async def all_failed() -> bool:
                s = await _summary(c)
                return bool(s["failed"] == 200 and s["pending"] == 0)

            await eventually(all_failed, timeout=60)
            # a failing receiver is probed one delivery at a time, not each one retried
            assert len(rec.posts) < 200
            for job in (hooked[0], hooked[-1]):
                await eventually(functools.partial(_in_state, srv.url, job, "failed"))
                assert (await _state(srv.url, job))["last_error"] == "HTTP 500"
            async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/metrics") as r:
                text = await r.text()
            assert 'prorl_callbacks_total{outcome="failed"} 200.0' in text
            assert "prorl_callbacks_pending 0.0" in text


async def test_a_410_answer_stops_retrying_at_once(make_server: ServerFactory) -> None:
    async with receiver(SECRET.encode()) as (rec, port):
        rec.status = 410
        async with make_server(callbacks=_callbacks()) as srv:
            job = await srv.client.submit(**_job(port))
            await eventually(lambda: len(rec.posts) == 1)

            await eventually(lambda: _in_state(srv.url, job, "failed"))
            assert (await _state(srv.url, job))["attempts"] == 1


async def test_delivery_resumes_after_kill9_during_retries(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text(
        '[callbacks]\nallow_hosts = ["127.0.0.1"]\nbackoff_s = 0.05\nmax_backoff_s = 0.2\n'
    )
    env = {"PRORL_CALLBACK_SECRET": SECRET}
    async with receiver(SECRET.encode()) as (rec, port):
        rec.status = 500
        async with server_process(tmp_path, env, "--config", str(config)) as (proc, url):
            async with RolloutClient(url) as c:
                ids = await c.submit_batch([_job(port)] * 10)
                # tried, failed, and the receiver probed again: deliveries wait in the outbox
                await eventually(lambda: len(rec.posts) >= 12, timeout=60)
                probed = Counter(p[0] for p in rec.posts).most_common(1)[0][0]
                tried = (await _state(url, probed))["attempts"]  # as committed
            proc.kill()
            await proc.wait()
        rec.status = 200
        async with server_process(tmp_path, env, "--config", str(config)) as (_, url):
            await eventually(lambda: set(rec.delivered()) == set(ids), timeout=60)
            assert all(signed for _, _, signed, _ in rec.posts)
            async with RolloutClient(url) as c:
                await eventually(lambda: _pending_is(c, 0))
                await eventually(lambda: _delivered(url, probed))  # committed
            state = await _state(url, probed)  # the attempts before the kill were kept
            assert state["attempts"] >= tried + 1


async def _in_state(url: str, job_id: str, state: str) -> bool:
    return bool((await _state(url, job_id))["state"] == state)


async def _delivered(url: str, job_id: str) -> bool:
    return await _in_state(url, job_id, "delivered")


async def _pending_is(c: RolloutClient, n: int) -> bool:
    return bool((await _summary(c))["pending"] == n)
