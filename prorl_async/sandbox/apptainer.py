"""Apptainer (or Singularity) runtime: ``apptainer exec`` of a ``.sif`` (see sif_templates/).

Flags: ``--containall --cleanenv --no-home --writable-tmpfs --pid`` always (own
/dev, ipc and pid namespaces, no host environment or home, a throw-away writable
overlay), ``--net --network none`` (no network), or ``--net --network bridge`` (its
own network namespace behind NAT, never the host's loopback) when the spec asks and
the operator allows it, ``--security uid:N,gid:N`` when the server runs as root (the
container runs as ``sandbox_uid``, not host root), ``--fakeroot`` when the spec needs
root inside (package installs; needs subuid/subgid entries, see deploy/apptainer.md),
binds for the workspace, ``/tmp`` and the socket directory (on the sandbox's
size-capped tmpfs), and the sandbox environment as ``APPTAINERENV_*`` variables. The
apptainer process itself gets a bare environment, plus Apptainer's own
``APPTAINER_*`` settings (never a ``*PASSWORD*``/``*TOKEN*``/``*SECRET*`` one).
"""

from __future__ import annotations

import os
import re
import shutil

from prorl_async.sandbox.layout import Layout
from prorl_async.sandbox.runtime import Runtime, RuntimeUnavailableError
from prorl_async.sandbox.spec import RuntimeConfig, SandboxSpec, SpecError

__all__ = ["ApptainerRuntime", "find_apptainer"]

_FIXED_FLAGS = ("--containall", "--cleanenv", "--no-home", "--writable-tmpfs", "--pid")
_OWN_SETTING = re.compile(r"(APPTAINER|SINGULARITY)_(?!.*(PASSWORD|TOKEN|SECRET))[A-Z0-9_]+")
_IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_apptainer(explicit: str | None = None) -> str | None:
    """``explicit``, else ``apptainer`` or ``singularity`` on PATH."""
    if explicit is not None:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("apptainer") or shutil.which("singularity")


class ApptainerRuntime(Runtime):
    """Sandboxes that are Apptainer containers of a prebuilt image."""

    name = "apptainer"

    def __init__(self, config: RuntimeConfig | None = None) -> None:
        super().__init__(config)
        binary = find_apptainer(self.config.apptainer)
        if binary is None:
            raise RuntimeUnavailableError(
                "apptainer runtime unavailable: neither apptainer nor singularity is on PATH"
            )
        self.binary = binary

    def _image(self, spec: SandboxSpec) -> str:
        image = spec.image or self.config.image
        if image is None:
            raise SpecError(
                "image: the apptainer runtime needs a .sif image (spec.image or config)"
            )
        return image

    def check_spec(self, spec: SandboxSpec) -> None:
        image = self._image(spec)
        if not os.path.isfile(image):
            raise SpecError(f"image: {image!r} is not a file")

    def command(self, spec: SandboxSpec, layout: Layout, ip: str) -> list[str]:
        argv = [self.binary, "exec", *_FIXED_FLAGS]
        argv += ["--net", "--network", "bridge" if spec.network else "none"]
        if self.drops_root:
            argv += ["--security", f"uid:{self.config.sandbox_uid},gid:{self.config.sandbox_gid}"]
        if spec.fakeroot:
            argv.append("--fakeroot")
        argv += ["--bind", f"{layout.workspace}:{layout.inner_workspace}"]
        argv += ["--bind", f"{layout.tmp}:/tmp"]
        argv += ["--bind", f"{layout.socket_dir}:{layout.inner_socket_dir}"]
        argv += ["--pwd", layout.inner_workspace, self._image(spec)]
        return argv + self.tool_server_argv(self.config.image_python, layout)

    def environment(self, spec: SandboxSpec, layout: Layout, ip: str) -> dict[str, str]:
        # APPTAINERENV_X survives --cleanenv as X inside; unlike --env it needs no escaping.
        env = super().environment(spec, layout, ip)
        # Apptainer's own settings (cache and tmp dirs) pass; --cleanenv keeps them outside.
        env.update({k: v for k, v in os.environ.items() if _OWN_SETTING.match(k)})
        inner = self.sandbox_env(spec, layout, ip)
        inner["PATH"] = _IMAGE_PATH
        prefix = (
            "SINGULARITYENV_" if os.path.basename(self.binary) == "singularity" else "APPTAINERENV_"
        )
        env.update({f"{prefix}{key}": value for key, value in inner.items()})
        return env
