"""docs/config.md lists every server setting, and its example file loads."""

from __future__ import annotations

import re
from pathlib import Path

from prorl_async.config import ServerConfig, load_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_every_config_field_is_documented() -> None:
    documented = set(re.findall(r"^\| `(\w+)` \|", DOC.read_text(), flags=re.M))
    assert documented == set(ServerConfig.__struct_fields__)


def test_the_documented_example_loads(tmp_path: Path) -> None:
    example = re.search(r"```toml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert example is not None
    path = tmp_path / "server.toml"
    path.write_text(example.group(1))
    cfg = load_config(path=str(path), env={})
    assert cfg.run_workers == 128 and cfg.warm_sandboxes == 4
    assert cfg.sandbox.extra_binds == ("/data/datasets",)
