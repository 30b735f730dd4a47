"""Reading config.json: from a dict, a file, a checkpoint directory, or a config shipped with fp4convert.

:class:`ModelConfig` is a read-only view whose accessors fail with a :class:`MappingError` naming the
missing or mistyped field, so a family's ``dims`` function stays one line per dimension.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fp4convert.errors import CheckpointError, MappingError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["ModelConfig", "load_config", "shipped_config_names"]


def _shipped_folder() -> Traversable:
    # Package data (pyproject: fp4convert/data/**/*); not a package itself, so reach it from fp4convert.
    return resources.files("fp4convert").joinpath("data").joinpath("configs")


def shipped_config_names() -> list[str]:
    """Names of the real-model config.json files shipped as package data (``fp4convert/data/configs``).

    Example:
        >>> "DeepSeek-V3" in shipped_config_names()
        True
    """
    folder = _shipped_folder()
    return sorted(item.name[: -len(".json")] for item in folder.iterdir() if item.name.endswith(".json"))


def load_config(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """Read a config.json.

    Args:
        source: a parsed config (returned as a copy), a path to a config.json, a checkpoint directory
            holding one, or the name of a shipped config (see :func:`shipped_config_names`).

    Returns:
        The parsed config.

    Raises:
        CheckpointError: the file is missing or is not a JSON object.

    Example:
        >>> load_config("DeepSeek-V3")["num_hidden_layers"]
        61
    """
    if isinstance(source, Mapping):
        return dict(source)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        shipped = shipped_config_names()
        if str(source) in shipped:
            text = _shipped_folder().joinpath(f"{source}.json").read_text(encoding="utf-8")
            return _parse(text, f"shipped config {source}")
        raise CheckpointError(
            f"no config.json at {path}",
            hint=("pass a config.json, a checkpoint directory, or one of the shipped configs: " + ", ".join(shipped)),
            file=str(path),
        )
    return _parse(path.read_text(encoding="utf-8"), str(path))


def _parse(text: str, origin: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{origin} is not valid JSON: {exc}", file=origin) from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{origin} holds a JSON {type(data).__name__}, not an object", file=origin)
    return data


_MISSING = object()


class ModelConfig:
    """Typed, read-only access to a config.json.

    Args:
        data: the parsed config.

    Example:
        >>> ModelConfig({"hidden_size": 64}).get_int("hidden_size")
        64
    """

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def get_int(self, key: str, default: Any = _MISSING, *, minimum: int = 0) -> int:
        """An integer field; ``default`` (when given) if the field is absent or null. Every field the
        families read is a count or a size: below ``minimum`` (1 for what divides) is refused."""
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise MappingError(
                    f"config.json has no `{key}`",
                    hint="the model family needs it to name and size the tensors",
                    field=key,
                )
            return int(default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise MappingError(f"config.json `{key}` is {value!r}, expected an integer", field=key)
        if value < minimum:
            raise MappingError(f"config.json `{key}` is {value}, expected an integer of at least {minimum}", field=key)
        return value

    def get_optional_int(self, key: str) -> int | None:
        """An integer field that may be absent or null (DeepSeek's ``q_lora_rank``)."""
        return None if self.data.get(key) is None else self.get_int(key)

    def get_flag(self, key: str, default: bool) -> bool:
        """A boolean field."""
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise MappingError(f"config.json `{key}` is {value!r}, expected true or false", field=key)
        return value

    def get_int_list(self, key: str) -> list[int]:
        """A list of integers (absent or null reads as empty)."""
        value = self.data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(item, int) for item in value):
            raise MappingError(f"config.json `{key}` is {value!r}, expected a list of integers", field=key)
        return list(value)

    def get_first_int(self, *keys: str) -> int:
        """The first of several spellings of one integer field (``num_experts`` / ``num_local_experts``)."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.get_int(key)
        raise MappingError(
            f"config.json has none of {', '.join(f'`{key}`' for key in keys)}",
            hint="the model family needs it to name and size the tensors",
            field=keys[0],
        )
