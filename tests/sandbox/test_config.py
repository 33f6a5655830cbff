"""The ``[sandbox]`` table of the server's config file reaches the runtime: every documented
field is accepted, a bad one is named, and binds and hidden paths take effect."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from prorl_async.config import ConfigError, load_config
from tests.handlers.policies import finished, serve
from tests.handlers.test_sandbox_task import Script
from tests.helpers import ServerFactory


def test_sandbox_table_is_loaded_and_checked(tmp_path: Path) -> None:
    toml = tmp_path / "server.toml"
    toml.write_text(
        '[sandbox]\nhide_paths = ["/opt/x"]\nextra_binds = ["/srv/data"]\n'
        "allow_network = true\nsandbox_uid = 4242\nsandbox_gid = 4243\n"
        'cgroup_parent = ""\nstart_timeout_s = 12.5\n'
        "[sandbox_limits]\nsandbox_memory_bytes = 1073741824\ndisk_bytes = 536870912\n"
    )
    cfg = load_config(path=str(toml), env={})
    assert cfg.sandbox.hide_paths == ("/opt/x",) and cfg.sandbox.extra_binds == ("/srv/data",)
    assert cfg.sandbox.allow_network and (cfg.sandbox.sandbox_uid, cfg.sandbox.sandbox_gid) == (
        4242,
        4243,
    )
    assert cfg.sandbox_limits.disk_bytes == 1 << 29
    for bad, needle in [
        ("[sandbox]\nextra_binds = ['relative']\n", "extra_binds"),
        ("[sandbox]\nsandbox_uid = 0\n", "sandbox_uid"),
        ("[sandbox]\nno_such_field = 1\n", "no_such_field"),
        ("[sandbox_limits]\ndisk_bytes = -1\n", "disk_bytes"),
    ]:
        toml.write_text(bad)
        with pytest.raises(ConfigError, match=needle):
            load_config(path=str(toml), env={})


async def test_extra_binds_and_hide_paths_reach_the_sandbox(make_server: ServerFactory) -> None:
    # Outside /tmp on purpose: a bound directory must not depend on the host's /tmp.
    base = Path(tempfile.mkdtemp(prefix="prorl-binds-", dir=Path.home()))
    try:
        (base / "shown").mkdir()
        (base / "shown" / "data.txt").write_text("visible\n")
        (base / "shown" / "hidden").mkdir()
        (base / "shown" / "hidden" / "key").write_text("secret")
        base.chmod(0o755)
        sandbox = {"extra_binds": [str(base / "shown")], "hide_paths": [str(base / "shown/hidden")]}
        probe = f"cat {base}/shown/data.txt; ls -A {base}/shown/hidden | wc -l"
        async with serve(make_server, Script([]), sandbox=sandbox) as srv:
            job = {"prompt": "x", "reward_command": probe}
            doc = await finished(srv, await srv.client.submit("sandbox", job))
        assert doc["status"] == "done", doc["error"]
        assert doc["eval"]["output"].split() == ["visible", "0"], doc["eval"]
    finally:
        shutil.rmtree(base)
