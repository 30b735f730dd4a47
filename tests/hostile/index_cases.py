"""Crafted ``model.safetensors.index.json`` files and headers that claim huge sizes, for the corpus.

Hub repos ship their index, so every command that reads a folder meets these: names outside the
folder (``../``, absolute), a name of a file that is not there, a tensor listed twice (JSON keeps the
last silently), an index that is a symlink out of the folder; on the source
(:data:`INDEX_SOURCE_CASES`) and on a converted output (:data:`INDEX_OUTPUT_CASES`). A header
claiming terabytes must be refused from its numbers alone, in bounded time and memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from hostile.cases import EXPERT, Case
from hostile.corpus import INDEX, Workspace, edit_header, edit_json, shard_of

#: the output's NVFP4 weight of EXPERT (ModelOpt names), the tensor the output cases aim at
PACKED = EXPERT


def _entry(folder: Callable[[Workspace], Path], tensor: str, value: object) -> Callable[[Workspace], None]:
    return lambda ws: edit_json(folder(ws) / INDEX, lambda i: i["weight_map"].update({tensor: value}))


def _listed_twice(folder: Callable[[Workspace], Path], tensor: str) -> Callable[[Workspace], None]:
    """The index names ``tensor`` twice: a stale shard first, then the right one (what JSON keeps)."""

    def edit(ws: Workspace) -> None:
        path = folder(ws) / INDEX
        index = json.loads(path.read_text())
        right = index["weight_map"][tensor]
        stale = next(s for s in sorted(set(index["weight_map"].values())) if s != right)
        text = json.dumps(index)
        key = json.dumps(tensor) + ": " + json.dumps(right)
        assert key in text
        path.write_text(text.replace(key, json.dumps(tensor) + ": " + json.dumps(stale) + ", " + key, 1))

    return edit


def _index_symlink_out(folder: Callable[[Workspace], Path]) -> Callable[[Workspace], None]:
    def edit(ws: Workspace) -> None:
        target = ws.victim / INDEX
        os.replace(folder(ws) / INDEX, target)
        (folder(ws) / INDEX).symlink_to(target)

    return edit


def _huge(header: dict) -> None:
    """EXPERT claims 2**40 x 2**40 BF16 values (2 ZiB) from where its data starts."""
    start = header[EXPERT]["data_offsets"][0]
    header[EXPERT]["shape"] = [2**40, 2**40]
    header[EXPERT]["data_offsets"] = [start, start + 2**81]


def _huge_shape_only(header: dict) -> None:
    """EXPERT's offsets are honest, its shape claims 2**62 x 2**62 values (product past int64)."""
    header[EXPERT]["shape"] = [2**62, 2**62]


def _src(ws: Workspace) -> Path:
    return ws.src


def _out(ws: Workspace) -> Path:
    return ws.out


INDEX_SOURCE_CASES: tuple[Case, ...] = (
    Case(
        "traversal",
        "index-missing-file",
        _entry(_src, EXPERT, "model-00009-of-00008.safetensors"),
        r"names model-00009-of-00008\.safetensors, which is missing",
    ),
    Case("traversal", "index-listed-twice", _listed_twice(_src, EXPERT), rf"lists '{EXPERT}' twice"),
    Case("traversal", "index-symlink-out", _index_symlink_out(_src), rf"{INDEX} resolves to .*outside"),
    Case(
        "lying-header",
        "huge-sizes",
        lambda ws: edit_header(shard_of(ws.src, EXPERT), _huge),
        r"at data offset \d+ overlaps the previous tensor",
    ),
    Case(
        "lying-header",
        "huge-shape",
        lambda ws: edit_header(shard_of(ws.src, EXPERT), _huge_shape_only),
        rf"'{EXPERT}' byte range",
    ),
)

INDEX_OUTPUT_CASES: tuple[Case, ...] = (
    Case("traversal", "index-parent", _entry(_out, PACKED, "../victim/evil.safetensors"), r"path separator"),
    Case("traversal", "index-absolute", _entry(_out, PACKED, "/etc/passwd"), r"'/etc/passwd', which is not a plain"),
    Case(
        "traversal",
        "index-missing-file",
        _entry(_out, PACKED, "model-00009-of-00008.safetensors"),
        r"model-00009-of-00008\.safetensors",
    ),
    Case("traversal", "index-listed-twice", _listed_twice(_out, PACKED), rf"lists '{PACKED}' twice"),
    Case("traversal", "index-symlink-out", _index_symlink_out(_out), rf"{INDEX} resolves to .*outside"),
)
