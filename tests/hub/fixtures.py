"""Fixtures for the hub tests: a running fake Hub with the client pointed at it, and converted outputs.

``hub`` starts :class:`~fake_hub.FakeHub` on 127.0.0.1 and points both this process and child
processes at it: ``HF_ENDPOINT`` (fp4convert reads it when called), a private cache and home,
``HF_TOKEN``, and Xet off. huggingface_hub reads its constants once, at import, so the in-process
ones are patched too: ``HF_HUB_DISABLE_XET`` (uploads would otherwise go through Xet, which the fake
does not implement), ``HF_HUB_CACHE``, the token file paths (no login of the machine leaks in),
``HF_HUB_OFFLINE`` (off), and the agent-harness registry (fetched once per process from the real
huggingface.co otherwise).

Import the fixtures into a test module with ``from hub.fixtures import *``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hub.fake_hub import FakeHub

__all__ = ["TOKEN", "USER", "hub", "hub_env", "source_files"]

TOKEN = "hf_fp4convertTESTtoken0123456789abcdef"
USER = "alice"


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A fresh fake Hub (one user, ``alice``, with :data:`TOKEN`) that the client talks to."""
    import huggingface_hub.constants as constants
    from huggingface_hub.utils import _detect_agent

    home = tmp_path / "hf-home"
    with FakeHub(tokens={TOKEN: USER}) as server:
        env = {
            "HF_ENDPOINT": server.url,
            "HF_TOKEN": TOKEN,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HOME": str(home),
            "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("FP4CONVERT_DEBUG", raising=False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", env["HF_HUB_CACHE"])
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
        monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
        monkeypatch.setattr(_detect_agent, "_registry", {}, raising=False)
        yield server


@pytest.fixture
def hub_env(hub: FakeHub) -> Callable[..., dict[str, str]]:
    """``hub_env(**overrides)``: the environment of a child process that uses the fake Hub."""

    def make(**overrides: str | None) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    return make


@pytest.fixture(scope="session")
def source_files(tiny_checkpoint: Callable[[str], Path]) -> Callable[[str], dict[str, bytes]]:
    """``source_files(model)``: the files of a tiny source checkpoint, to push to the fake Hub."""

    def get(model: str = "qwen3_moe") -> dict[str, bytes]:
        root = tiny_checkpoint(model)
        return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}

    return get
