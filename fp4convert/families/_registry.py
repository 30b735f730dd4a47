"""The explicit family registry: keyed by :class:`FamilyKey`, duplicates refused, lookups that explain.

Nothing registers itself on import: :mod:`fp4convert.families` registers the built-in families in
one visible tuple, and ``tests/families/test_registry.py`` holds the expected contents.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fp4convert.errors import MappingError
from fp4convert.families._tables import Family, FamilyKey

__all__ = ["FamilyRegistry"]


class FamilyRegistry:
    """Families by key, plus the ``architectures`` / ``model_type`` values that select them.

    Example:
        >>> from fp4convert.families.llama import LLAMA
        >>> registry = FamilyRegistry()
        >>> registry.register(LLAMA)
        >>> registry.get("llama") is LLAMA
        True
    """

    def __init__(self) -> None:
        self._families: dict[FamilyKey, Family] = {}
        self._by_architecture: dict[str, Family] = {}
        self._by_model_type: dict[str, Family] = {}

    def register(self, family: Family) -> None:
        """Add a family.

        Raises:
            MappingError: the key, or one of its architectures / model types, is already registered.
        """
        if family.key in self._families:
            raise MappingError(
                f"family `{family.key.value}` is already registered",
                hint="each family key is registered exactly once",
                family=family.key.value,
            )
        for value, claimed in [
            *((arch, self._by_architecture) for arch in family.architectures),
            *((model_type, self._by_model_type) for model_type in family.model_types),
        ]:
            if value in claimed:
                raise MappingError(
                    f"`{value}` already selects family `{claimed[value].key.value}`; "
                    f"family `{family.key.value}` cannot claim it too",
                    family=family.key.value,
                )
        self._families[family.key] = family
        self._by_architecture.update(dict.fromkeys(family.architectures, family))
        self._by_model_type.update(dict.fromkeys(family.model_types, family))

    def keys(self) -> list[str]:
        """Registered keys, sorted."""
        return sorted(key.value for key in self._families)

    def __iter__(self) -> Iterator[Family]:
        return iter(self._families.values())

    def __len__(self) -> int:
        return len(self._families)

    def get(self, key: str | FamilyKey | Family) -> Family:
        """The family registered under ``key`` (a :class:`Family` is returned as is).

        Raises:
            MappingError: no such key; the message lists the valid ones.
        """
        if isinstance(key, Family):
            return key
        try:
            return self._families[FamilyKey(key)]
        except (ValueError, KeyError):
            raise MappingError(
                f"unknown model family `{key}`",
                hint=f"valid families: {', '.join(self.keys())}",
                family=str(key),
            ) from None

    def for_config(self, config: Mapping[str, Any]) -> Family:
        """The family a config.json belongs to: by ``architectures`` first, then ``model_type``.

        Raises:
            MappingError: neither field names a supported model; the message lists the supported
                architectures and model types.
        """
        architectures = config.get("architectures") or []
        for architecture in architectures:
            if architecture in self._by_architecture:
                return self._by_architecture[architecture]
        model_type = config.get("model_type")
        if isinstance(model_type, str) and model_type in self._by_model_type:
            return self._by_model_type[model_type]
        text = config.get("text_config")
        text_type = text.get("model_type") if isinstance(text, Mapping) else None
        wrapped = (
            f"a multimodal model whose text model (text_config.model_type {text_type!r}) is no fp4convert family "
            "either, so its vision tower and `language_model` tensors are not mapped (docs/families.md says how "
            "to add a family); "
            if text is not None
            else ""
        )
        raise MappingError(
            f"unsupported model: architectures {list(architectures)}, model_type {model_type!r}",
            hint=(
                f"{wrapped}supported architectures: {', '.join(sorted(self._by_architecture))}; "
                f"model types: {', '.join(sorted(self._by_model_type))}"
            ),
            architectures=list(architectures),
            model_type=model_type,
        )
