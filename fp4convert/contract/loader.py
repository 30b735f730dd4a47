"""Read a contract file (YAML or JSON) into a :class:`Contract`, or fail with file, line and field.

Only safe loading: YAML goes through :class:`yaml.SafeLoader` (compose, then construct), JSON
through :func:`json.loads`. The composed YAML node tree keeps line numbers, so a pydantic error
location such as ``('rules', 2, 'format')`` is mapped back to the line it came from. Duplicate
keys, which both YAML and JSON loaders would silently resolve to the last value, are errors.

A contract is untrusted input, so the work is bounded before anything walks the document: at most
:data:`MAX_CONTRACT_BYTES` of text (:data:`MAX_DOCUMENT_BYTES` for other documents such as tensor
lists), YAML aliases may add at most :data:`MAX_ALIAS_NODES` nodes to the tree they expand into (an
alias bomb expands exponentially), an alias may not contain itself, and nesting deeper than
:data:`MAX_DEPTH` levels is an error, not a crash.

Each problem becomes one :class:`~fp4convert.errors.ContractError` whose message is one line,
``FILE:LINE: FIELD: what is wrong``, and whose hint says what to do; the structured fields
``file``, ``line`` and ``field`` carry the same facts for programs.
"""

from __future__ import annotations

import difflib
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from fp4convert.contract.model import Contract
from fp4convert.contract.sections import UNION_TAGS
from fp4convert.errors import ContractError, Fp4ConvertError

__all__ = [
    "MAX_ALIAS_NODES",
    "MAX_CONTRACT_BYTES",
    "MAX_DOCUMENT_BYTES",
    "load_contract",
    "parse_contract",
    "read_document",
    "validate_document",
]

_SUFFIXES = (".yaml", ".yml", ".json")
#: the largest contract text read (the shipped ones are a few KB)
MAX_CONTRACT_BYTES = 1 << 20
#: the largest other YAML/JSON document read (tensor lists of the largest models are a few MB)
MAX_DOCUMENT_BYTES = 64 << 20
#: how many nodes YAML aliases may add to a document when expanded
MAX_ALIAS_NODES = 100_000
#: how deep a document may nest (a contract nests four levels)
MAX_DEPTH = 64


class _TooDeep(Exception):
    def __init__(self, line: int) -> None:
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses to nest deeper than :data:`MAX_DEPTH` (it recurses)."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# Hints for errors on particular fields, keyed by the field path with list indexes dropped.
_FIELD_HINTS: dict[str, str] = {
    "version": "add `version: 1` (the only contract format version)",
    "default": "set `default:` to nvfp4, mxfp8 or bf16, or to null to require a rule for every GEMM weight",
    "rules": "a contract needs at least one rule, e.g. {kind: glob, namespace: hf, pattern: '*', format: bf16}",
    "name": "names use letters, digits, '_', '.' and '-', and start with a letter",
    "rules.name": "names use letters, digits, '_', '.' and '-', and start with a letter",
    "rules.pattern": "glob uses fnmatch (* ? [seq], close every '['); regex uses Python re "
    "syntax (its regular subset: no backreferences, lookaround or inline flags) and must match the whole name; "
    "exact is the whole name",
    "bf16_exceptions.embeddings": "embeddings are never quantized; leave the field out or write true",
    "bf16_exceptions.norms": "norm weights are never quantized; leave the field out or write true",
    "bf16_exceptions.first_layers": "write a count (e.g. 2) or {fraction: 0.15, rounding: ceil}",
    "bf16_exceptions.last_layers": "write a count (e.g. 8) or {fraction: 0.15, rounding: ceil}",
}


def load_contract(path: str | os.PathLike[str]) -> Contract:
    """Load and validate a contract file.

    Args:
        path: a ``.yaml``, ``.yml`` or ``.json`` file, or the name of a shipped contract
            (``nvfp4-experts-per-token``; see :mod:`fp4convert.contract.shipped`).

    Returns:
        The contract.

    Raises:
        ContractError: the file is missing, unreadable, not valid YAML/JSON, or not a valid
            contract; the message names the file, line and field.

    Example:
        >>> contract = load_contract("contracts/nvfp4-experts-per-token.yaml")
        >>> contract.backward, contract.formats.nvfp4.per_token_activations
        ('high_precision', True)
    """
    from fp4convert.contract.shipped import resolve_contract_path, shipped_contracts

    resolved = resolve_contract_path(path)
    text = os.fspath(resolved)
    if not Path(text).exists() and not Path(text).suffix and os.sep not in text:
        names = sorted(shipped_contracts())
        close = difflib.get_close_matches(text, names, n=1, cutoff=0.5)
        guess = f"did you mean '{close[0]}'? " if close else ""
        raise ContractError(
            f"{text}: no such contract file, and no shipped contract of that name",
            hint=f"{guess}shipped contracts: {', '.join(names)}; or give the path of a .yaml/.json file",
            file=text,
        )
    data, root, source = read_document(resolved, error_cls=ContractError, max_bytes=MAX_CONTRACT_BYTES)
    return validate_document(Contract, data, root, source, error_cls=ContractError)


def parse_contract(text: str, *, source: str = "<contract>", json_text: bool = False) -> Contract:
    """Validate contract text (YAML unless ``json_text``); errors name ``source`` as the file.

    Example:
        >>> parse_contract("version: 1\\nname: x\\ndefault: bf16\\nrules: "
        ...                "[{kind: glob, namespace: hf, pattern: '*', format: bf16}]").name
        'x'
    """
    data, root = _parse_text(text, source, json_text=json_text, error_cls=ContractError, max_bytes=MAX_CONTRACT_BYTES)
    return validate_document(Contract, data, root, source, error_cls=ContractError)


def read_document(
    path: str | os.PathLike[str], *, error_cls: type[Fp4ConvertError], max_bytes: int = MAX_DOCUMENT_BYTES
) -> tuple[Any, Node | None, str]:
    """Read a YAML or JSON file safely: (data, YAML node tree for line numbers or None, source).

    Args:
        path: a ``.yaml``, ``.yml`` or ``.json`` file.
        error_cls: the exception to raise (ContractError for contracts, MappingError for models).
        max_bytes: the largest file read.

    Returns:
        The parsed data, the composed YAML node tree (None if a JSON file is not also valid YAML)
        and the file name used in messages.

    Raises:
        error_cls: the file is missing, has another extension, is too large, or does not parse.

    Example:
        >>> data, root, source = read_document("contracts/bf16-all.yaml", error_cls=ContractError)
        >>> data["name"], root.start_mark.line, source
        ('bf16-all', 1, 'contracts/bf16-all.yaml')
    """
    file = Path(path)
    source = str(file)
    if file.suffix.lower() not in _SUFFIXES:
        raise error_cls(
            f"{source}: unsupported file extension '{file.suffix}'",
            hint=f"write the file as YAML or JSON with one of the extensions {', '.join(_SUFFIXES)}",
            file=source,
        )
    try:
        with file.open("rb") as f:
            raw = f.read(max_bytes + 1)  # never more than the cap, whatever the file's size
        _check_size(len(raw), max_bytes, source, error_cls)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise error_cls(f"{source}: cannot read the file: {reason}", hint="check the path", file=source) from exc
    data, root = _parse_text(
        text, source, json_text=file.suffix.lower() == ".json", error_cls=error_cls, max_bytes=max_bytes
    )
    return data, root, source


def _check_size(size: int, max_bytes: int, source: str, error_cls: type[Fp4ConvertError]) -> None:
    if size > max_bytes:
        raise error_cls(
            f"{source}: the document is larger than {max_bytes} bytes",
            hint="a contract is a few kilobytes; check that this is the right file",
            file=source,
        )


def _children(node: Node) -> list[Node]:
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: Node, source: str, error_cls: type[Fp4ConvertError]) -> None:
    """Refuse a node tree that contains itself (a recursive alias) or whose aliases expand it by
    more than :data:`MAX_ALIAS_NODES` nodes. Iterative and memoized: linear in the distinct nodes."""
    expanded: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            on_path.discard(key)
            expanded[key] = 1 + sum(expanded[id(child)] for child in _children(node))
            continue
        if key in expanded:
            continue
        if key in on_path:
            line = node.start_mark.line + 1
            raise error_cls(
                f"{source}:{line}: a YAML alias refers to a node that contains it",
                hint="write the value out; a contract cannot be recursive",
                file=source,
                line=line,
            )
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in expanded)
    if expanded[id(root)] > len(expanded) + MAX_ALIAS_NODES:
        raise error_cls(
            f"{source}: YAML aliases expand the document to {expanded[id(root)]} nodes "
            f"({len(expanded)} written; at most {MAX_ALIAS_NODES} more are allowed)",
            hint="write the values out instead of repeating aliases (an alias bomb?)",
            file=source,
        )


def _parse_text(
    text: str, source: str, *, json_text: bool, error_cls: type[Fp4ConvertError], max_bytes: int = MAX_DOCUMENT_BYTES
) -> tuple[Any, Node | None]:
    _check_size(len(text.encode("utf-8", "surrogatepass")), max_bytes, source, error_cls)
    try:
        return _parse_bounded(text, source, json_text=json_text, error_cls=error_cls)
    except (RecursionError, _TooDeep) as exc:
        line = exc.line if isinstance(exc, _TooDeep) else None
        raise error_cls(
            f"{source}{f':{line}' if line else ''}: the document nests deeper than {MAX_DEPTH} levels",
            hint="a contract nests a few levels; check that this is the right file",
            file=source,
            line=line,
        ) from None


def _parse_bounded(
    text: str, source: str, *, json_text: bool, error_cls: type[Fp4ConvertError]
) -> tuple[Any, Node | None]:
    root: Node | None
    if json_text:
        # json.loads has JSON's exact number and string rules; the YAML composition (which
        # parses nearly all JSON) only serves line numbers and the duplicate-key check.
        try:
            root = yaml.compose(text, Loader=_BoundedLoader)
        except yaml.YAMLError:
            root = None
        if root is not None:
            _check_expansion(root, source, error_cls)
            _reject_duplicate_keys(root, source, error_cls)
        try:
            return json.loads(text, object_pairs_hook=_json_object(source, error_cls)), root
        except json.JSONDecodeError as exc:
            raise error_cls(
                f"{source}:{exc.lineno}: invalid JSON: {exc.msg}",
                hint="fix the JSON syntax",
                file=source,
                line=exc.lineno,
            ) from exc
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # the reader checks every character here already
        root = loader.get_single_node()
        if root is None:
            return None, None
        _check_expansion(root, source, error_cls)
        _reject_duplicate_keys(root, source, error_cls)
        return loader.construct_document(root), root
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise error_cls(
            f"{source}:{line}: invalid YAML: {exc.problem or exc.context}",
            hint="fix the YAML syntax (indentation, quotes, ':' after every key)",
            file=source,
            line=line,
        ) from exc
    except yaml.YAMLError as exc:  # e.g. a control character (ReaderError carries no line)
        reason = str(exc).splitlines()[0]
        raise error_cls(
            f"{source}: invalid YAML: {reason}",
            hint="a contract is plain UTF-8 text; remove control characters",
            file=source,
        ) from exc
    finally:
        if loader is not None:
            loader.dispose()


def _json_object(source: str, error_cls: type[Fp4ConvertError]) -> Any:
    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise error_cls(
                    f"{source}: duplicate key '{key}'",
                    hint="each key may appear once per object; remove one",
                    file=source,
                    field=key,
                )
            result[key] = value
        return result

    return build


def _reject_duplicate_keys(node: Node, source: str, error_cls: type[Fp4ConvertError]) -> None:
    if isinstance(node, MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, ScalarNode):
                key, line = key_node.value, key_node.start_mark.line + 1
                if key in seen:
                    raise error_cls(
                        f"{source}:{line}: duplicate key '{key}' (first on line {seen[key]})",
                        hint="each key may appear once per mapping; remove one",
                        file=source,
                        line=line,
                        field=key,
                    )
                seen[key] = line
            _reject_duplicate_keys(value_node, source, error_cls)
    elif isinstance(node, SequenceNode):
        for item in node.value:
            _reject_duplicate_keys(item, source, error_cls)


def _locate(root: Node | None, loc: list[int | str]) -> Node | None:
    """The node a location points at; the nearest existing ancestor when a key is missing.

    For a mapping entry the *key* node is returned, so the line is where the field is written.
    """
    node = root
    found = root
    for part in loc:
        if isinstance(node, MappingNode) and isinstance(part, str):
            entry = next((kv for kv in node.value if isinstance(kv[0], ScalarNode) and kv[0].value == part), None)
            if entry is None:
                break
            found, node = entry
        elif isinstance(node, SequenceNode) and isinstance(part, int) and part < len(node.value):
            found = node = node.value[part]
        else:
            break
    return found


def _field_path(loc: list[int | str]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(document)"


def _model_at(model: type[BaseModel], loc: list[int | str]) -> type[BaseModel] | None:
    """The pydantic model class that validates the mapping at ``loc`` (for field suggestions)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return None
        current = _unwrap_model(current.model_fields[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap_model(annotation: Any) -> Any:
    # Look through Annotated / Optional / unions / tuples to the model class inside, if any.
    origin = typing.get_origin(annotation)
    if origin is None:
        return annotation
    for arg in typing.get_args(annotation):
        inner = _unwrap_model(arg)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return None if origin in (typing.Union, types.UnionType) else annotation


# Error types whose message already shows the offending value.
_SHOWS_VALUE = frozenset({"exact_type", "duplicate_rule_name"})
# Type errors where a quoted value ("8", "true") is the usual cause.
_SCALAR_TYPE_ERRORS = frozenset({"int_type", "bool_type", "float_type", "exact_type"})


def _describe(error: ErrorDetails, loc: list[int | str], model: type[BaseModel]) -> tuple[str, str]:
    """(what is wrong, what to do) for one pydantic error."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    found = error.get("input")
    key = ".".join(str(p) for p in loc if isinstance(p, str))
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        valid = list(parent.model_fields) if parent is not None else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        guess = f"did you mean '{close[0]}'? " if close else ""
        return f"unknown field '{loc[-1]}'", f"{guess}valid fields here: {', '.join(valid)}"
    if kind == "missing":
        return "required field is missing", _FIELD_HINTS.get(key, f"add `{loc[-1]}:`")
    if kind == "literal_error":
        if key in _FIELD_HINTS:
            return f"found {found!r}, expected {ctx.get('expected')}", _FIELD_HINTS[key]
        options = [o.strip().strip("'") for o in str(ctx.get("expected", "")).replace(" or ", ", ").split(",")]
        close = difflib.get_close_matches(str(found), options, n=1)
        guess = f"did you mean '{close[0]}'? " if close else ""
        return f"found {found!r}, expected {ctx.get('expected')}", f"{guess}use one of {', '.join(options)}"
    if kind == "invalid_pattern":
        return f"{ctx.get('problem')}: {found!r}", _FIELD_HINTS["rules.pattern"]
    if kind == "too_short" and key == "rules":
        return "the rule set is empty", _FIELD_HINTS["rules"]
    what = error["msg"][0].lower() + error["msg"][1:]
    if kind in ("model_type", "dict_type") and found is None and not loc:
        return "the file is empty", "write a contract mapping; `fp4convert contract schema` prints its form"
    what = what.replace("a valid tuple", "a list")  # the file has lists; tuples are internal
    if kind not in _SHOWS_VALUE:
        shown = repr(found)
        what = f"{what}, found {shown if len(shown) <= 60 else shown[:57] + '...'}"
    if isinstance(found, str) and kind in _SCALAR_TYPE_ERRORS:
        return what, "write the value without quotes"
    return what, _FIELD_HINTS.get(key, "`fp4convert contract schema` prints the expected form")


def validate_document(
    model: type[Any], data: Any, root: Node | None, source: str, *, error_cls: type[Fp4ConvertError]
) -> Any:
    """Validate parsed data with a pydantic model; turn the first error into one ``error_cls``.

    The error reported is the one earliest in the file; the message says how many more there are.

    Args:
        model: the pydantic model class.
        data: the parsed document.
        root: its YAML node tree (for line numbers), or None.
        source: the file name used in messages.
        error_cls: the exception to raise.

    Returns:
        The validated model instance.

    Raises:
        error_cls: with ``file``, ``line`` and ``field`` set.

    Example:
        >>> data, root, source = read_document("contracts/bf16-all.yaml", error_cls=ContractError)
        >>> validate_document(Contract, {**data, "backward": "fast"}, root, source, error_cls=ContractError)
        Traceback (most recent call last):
        ...
        fp4convert.errors.ContractError: contracts/bf16-all.yaml:19: backward: found 'fast', ...
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        locs = [tuple(p for p in e["loc"] if p not in UNION_TAGS) for e in errors]
        problems = []
        for error, loc_key in zip(errors, locs, strict=True):
            # An error on a container whose items also failed (pydantic then also reports e.g.
            # "at least 1 item after validation" on the list) adds nothing: keep the deeper one.
            if any(len(other) > len(loc_key) and other[: len(loc_key)] == loc_key for other in locs):
                continue
            loc = list(loc_key)
            node = _locate(root, loc)
            line = node.start_mark.line + 1 if node is not None else None
            problems.append((line if line is not None else 1 << 30, loc, error))
        problems.sort(key=lambda item: item[0])
        line_key, loc, error = problems[0]
        line = None if line_key == 1 << 30 else line_key
        field = _field_path(loc)
        what, hint = _describe(error, loc, model)
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        where = f"{source}:{line}" if line is not None else source
        raise error_cls(f"{where}: {field}: {what}{more}", hint=hint, file=source, line=line, field=field) from None
