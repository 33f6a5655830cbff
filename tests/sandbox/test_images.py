"""build-image: template rendering, cache keys by mode, atomic builds (apptainer TEST DOUBLE)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prorl_async.sandbox import images
from prorl_async.sandbox.images import ImageError, build_image, render


def _builds(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    calls = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    return [c for c in calls if c[0] == "build"]


@pytest.mark.parametrize("name", ["base", "math", "swe"])
def test_templates_render(name: str, tmp_path: Path) -> None:
    text = render(name, base="docker://python:3.12-slim")
    assert text.startswith("Bootstrap: docker\nFrom: python:3.12-slim\n")
    assert "pip install --no-cache-dir /opt/prorl-async" in text
    assert "prorl_async.toolserver" in text
    extra = {"base": None, "math": "numpy sympy", "swe": "git patch"}[name]
    if extra:
        assert extra in text
    lock = tmp_path / "req.lock"
    lock.write_text("msgspec==0.18.6\n")
    locked = render(name, lockfile=lock)
    assert "-r /opt/prorl-async.lock" in locked and "--no-deps /opt/prorl-async" in locked
    assert "numpy sympy" not in locked  # pinned deps come from the lockfile only


def test_bad_inputs_are_named(tmp_path: Path, apptainer_double: Path) -> None:
    with pytest.raises(ImageError, match="'nope'"):
        build_image("nope", "versioned", cache_dir=tmp_path)
    with pytest.raises(ImageError, match="--mode lock needs --lockfile"):
        build_image("base", "lock", cache_dir=tmp_path)
    with pytest.raises(ImageError, match="--mode 'fast'"):
        build_image("base", "fast", cache_dir=tmp_path)
    with pytest.raises(ImageError, match="--base 'python'"):
        build_image("base", "versioned", base="python", cache_dir=tmp_path)
    assert _builds(apptainer_double) == []


def test_versioned_builds_once_with_fakeroot_and_renames(
    tmp_path: Path, apptainer_double: Path
) -> None:
    first = build_image("math", "versioned", cache_dir=tmp_path)
    assert not first.cached and first.path.parent == tmp_path
    (argv,) = _builds(apptainer_double)
    assert argv[:3] == ["build", "--fakeroot", "--force"]
    out, definition = Path(argv[3]), Path(argv[4])
    assert out != first.path and out.parent == first.path.parent  # built aside, renamed in
    assert first.path.read_bytes().startswith(b"SIF-DOUBLE\n") and len(first.path.read_bytes()) > 20
    assert not out.exists() and not definition.exists()
    again = build_image("math", "versioned", cache_dir=tmp_path)
    assert again.cached and again.path == first.path and len(_builds(apptainer_double)) == 1
    other = build_image("math", "versioned", base="docker://python:3.12-slim", cache_dir=tmp_path)
    assert not other.cached and other.key != first.key
    assert len(_builds(apptainer_double)) == 2


def test_lock_mode_keys_on_lockfile_contents(
    tmp_path: Path, apptainer_double: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "req.lock"
    lock.write_text("numpy==1.26.4\n")
    cache = tmp_path / "cache"
    a = build_image("base", "lock", lockfile=lock, cache_dir=cache)
    monkeypatch.setattr(images, "__version__", "99.0")  # the version is not part of a lock key
    assert build_image("base", "lock", lockfile=lock, cache_dir=cache).cached
    assert not build_image("base", "versioned", cache_dir=cache).cached
    lock.write_text("numpy==2.0.0\n")
    b = build_image("base", "lock", lockfile=lock, cache_dir=cache)
    assert not b.cached and b.key != a.key and b.path != a.path


def test_scratch_always_rebuilds(tmp_path: Path, apptainer_double: Path) -> None:
    one = build_image("swe", "scratch", cache_dir=tmp_path)
    two = build_image("swe", "scratch", cache_dir=tmp_path)
    assert not one.cached and not two.cached and len(_builds(apptainer_double)) == 2


def test_failed_build_leaves_nothing(
    tmp_path: Path, apptainer_double: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APPTAINER_DOUBLE_FAIL_BUILD", "1")
    cache = tmp_path / "cache"
    with pytest.raises(ImageError, match="failed"):
        build_image("base", "versioned", cache_dir=cache)
    assert len(_builds(apptainer_double)) == 1
    assert list(cache.iterdir()) == []  # no image, no temp image, no temp definition


def test_main_prints_the_path(
    tmp_path: Path, apptainer_double: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert images.main(["base", "--mode", "versioned", "--cache-dir", str(tmp_path)]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.is_file() and path.parent == tmp_path
    assert images.main(["base", "--mode", "lock", "--cache-dir", str(tmp_path)]) == 2
    assert "--lockfile" in capsys.readouterr().err
