"""Build Apptainer images of the tool server from the Jinja2 templates in ``sif_templates/``.

``prorl-async build-image TEMPLATE --mode scratch|versioned|lock`` renders the
definition, computes a cache key and reuses a cached ``.sif`` whose key matches:

- ``scratch``: never reuse, always rebuild;
- ``versioned``: key = template + base image + prorl_async version;
- ``lock``: key = template + base image + the lockfile's contents (pinned deps).

A build goes to a temp file in the cache directory with ``apptainer build
--fakeroot`` and is renamed into place only when it succeeded, so a reader never
sees a half-written image and a failed build leaves nothing behind.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2

from prorl_async.sandbox.apptainer import find_apptainer
from prorl_async.util.version import __version__

__all__ = [
    "DEFAULT_BASE",
    "BuildResult",
    "ImageError",
    "build_image",
    "build_parser",
    "main",
    "render",
]

DEFAULT_BASE = "docker://python:3.11-slim-bookworm"
MODES = ("scratch", "versioned", "lock")
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


class ImageError(RuntimeError):
    """An image could not be rendered or built; the message says which input was wrong."""


@dataclass(frozen=True, slots=True)
class BuildResult:
    """The image path, its cache key and whether it came from the cache."""

    path: Path
    key: str
    cached: bool


def default_templates_dir() -> Path:
    """``sif_templates/`` next to the package (a source checkout or editable install)."""
    return _SOURCE_ROOT / "sif_templates"


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "prorl-async" / "images"


def _split_base(base: str) -> tuple[str, str]:
    scheme, sep, rest = base.partition("://")
    if not sep or not rest:
        if base.endswith(".sif"):
            return "localimage", base
        raise ImageError(f"--base {base!r}: expected docker://IMAGE, library://..., or a .sif path")
    return scheme, rest


def _template_path(template: str, templates_dir: Path) -> Path:
    path = templates_dir / (template if template.endswith(".j2") else f"{template}.def.j2")
    if not path.is_file():
        names = sorted(p.name.removesuffix(".def.j2") for p in templates_dir.glob("*.def.j2"))
        raise ImageError(f"template {template!r} not found in {templates_dir}; have {names}")
    return path


def cache_key(template_text: str, mode: str, base: str, lockfile: Path | None) -> str:
    """The cache key of a build (``scratch`` builds get a key but are never reused)."""
    h = hashlib.sha256()
    h.update(template_text.encode())
    h.update(f"\0{mode}\0{base}\0".encode())
    if mode == "lock":
        if lockfile is None:
            raise ImageError("--mode lock needs --lockfile")
        h.update(lockfile.read_bytes())
    else:
        h.update(__version__.encode())
    return h.hexdigest()


def _template_text(templates_dir: Path, path: Path) -> str:
    # The key covers the template and the base it extends.
    parts = [path.read_text()]
    base = templates_dir / "base.def.j2"
    if base != path and base.is_file():
        parts.append(base.read_text())
    return "\0".join(parts)


def render(
    template: str,
    *,
    base: str = DEFAULT_BASE,
    lockfile: Path | None = None,
    key: str = "",
    templates_dir: Path | None = None,
) -> str:
    """The Apptainer definition text for ``template``."""
    tdir = templates_dir or default_templates_dir()
    path = _template_path(template, tdir)
    env = _environment(tdir)
    bootstrap, from_ = _split_base(base)
    return env.get_template(path.name).render(
        bootstrap=bootstrap,
        from_=from_,
        template=path.name.removesuffix(".def.j2"),
        version=__version__,
        cache_key=key,
        source=str(_SOURCE_ROOT),
        lockfile=str(lockfile) if lockfile is not None else None,
    )


def _environment(templates_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def build_image(
    template: str,
    mode: str,
    *,
    lockfile: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    base: str = DEFAULT_BASE,
    apptainer: str | None = None,
    templates_dir: str | os.PathLike[str] | None = None,
) -> BuildResult:
    """Render, key, and build (or reuse) the image for ``template``; see the module docstring."""
    if mode not in MODES:
        raise ImageError(f"--mode {mode!r}: choose one of {', '.join(MODES)}")
    lock = Path(lockfile) if lockfile is not None else None
    if lock is not None and not lock.is_file():
        raise ImageError(f"--lockfile {str(lock)!r} is not a file")
    tdir = Path(templates_dir) if templates_dir is not None else default_templates_dir()
    key = cache_key(_template_text(tdir, _template_path(template, tdir)), mode, base, lock)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    name = Path(template).name.removesuffix(".j2").removesuffix(".def")
    final = cache / f"{name}-{key[:16]}.sif"
    if mode != "scratch" and final.is_file():
        return BuildResult(final, key, cached=True)
    definition = render(template, base=base, lockfile=lock, key=key, templates_dir=tdir)
    _build(definition, final, apptainer)
    return BuildResult(final, key, cached=False)


def _build(definition: str, final: Path, apptainer: str | None) -> None:
    binary = find_apptainer(apptainer)
    if binary is None:
        raise ImageError("apptainer (or singularity) not found on PATH; see deploy/apptainer.md")
    fd, def_path = tempfile.mkstemp(dir=final.parent, prefix=f".{final.stem}.", suffix=".def")
    with os.fdopen(fd, "w") as f:
        f.write(definition)
    tmp = Path(def_path).with_suffix(".tmp.sif")
    try:
        done = subprocess.run([binary, "build", "--fakeroot", "--force", str(tmp), def_path])
        if done.returncode != 0 or not tmp.is_file():
            raise ImageError(f"apptainer build of {final.name} failed (exit {done.returncode})")
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
        Path(def_path).unlink(missing_ok=True)


_DESCRIPTION = (
    "Build an Apptainer image (.sif) of the tool server from a template in sif_templates/, "
    "or reuse a cached one whose key matches. The build goes to a temp file and is renamed "
    "into place only when it succeeded."
)
_MODE_HELP = (
    "when to reuse a cached image: scratch (never, always rebuild), versioned (same "
    "template, base image and prorl_async version), lock (same template, base image and "
    "--lockfile contents) (default versioned)"
)


def build_parser() -> argparse.ArgumentParser:
    """The ``prorl-async build-image`` command line."""
    p = argparse.ArgumentParser(prog="prorl-async build-image", description=_DESCRIPTION)
    p.add_argument("template", help="template name in sif_templates/: base, math or swe")
    p.add_argument("--mode", choices=MODES, default="versioned", help=_MODE_HELP)
    p.add_argument(
        "--lockfile", help="pinned requirements file (required for --mode lock; default: none)"
    )
    p.add_argument("--cache-dir", help=f"where images are kept (default {default_cache_dir()})")
    p.add_argument("--base", default=DEFAULT_BASE, help=f"bootstrap image (default {DEFAULT_BASE})")
    p.add_argument("--apptainer", help="apptainer/singularity binary (default: from PATH)")
    p.add_argument(
        "--templates-dir", help="directory of *.def.j2 templates (default: sif_templates/)"
    )
    p.add_argument(
        "--render-only",
        action="store_true",
        help="print the definition and exit (default: off, build)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """CLI entry: print the image path (or the rendered definition); 2 on bad input."""
    args = build_parser().parse_args(argv)
    try:
        if args.render_only:
            lock = Path(args.lockfile) if args.lockfile else None
            tdir = Path(args.templates_dir) if args.templates_dir else None
            sys.stdout.write(
                render(args.template, base=args.base, lockfile=lock, templates_dir=tdir)
            )
            return 0
        result = build_image(
            args.template,
            args.mode,
            lockfile=args.lockfile,
            cache_dir=args.cache_dir,
            base=args.base,
            apptainer=args.apptainer,
            templates_dir=args.templates_dir,
        )
    except ImageError as exc:
        sys.stderr.write(f"build-image: {exc}\n")
        return 2
    state = "cached" if result.cached else "built"
    sys.stdout.write(f"{result.path}\n")
    sys.stderr.write(f"build-image: {state} {result.path} (key {result.key[:16]})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
