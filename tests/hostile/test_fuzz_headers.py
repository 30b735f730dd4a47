"""A lying shard header, fuzzed through the whole of ``convert``: one to three edits of its JSON
that keep the file well formed (a dtype of the same size, a shape of as many elements, a name
changed or traded, two tensors' bytes traded, the metadata), so only what the model and the index
say can find them out, on a tiny Qwen3-MoE source, an FP8 block-scaled one and an MXFP4 one. Each
run either converts, and then ``verify --source`` re-derives every byte from the edited source, or
is refused with one fp4convert error, leaving no DST, no complete-looking DST.partial and every
other file as it was (:func:`hostile.corpus.judge`). The edits come from fixed seeds: the same
cases on every run.
"""

from __future__ import annotations

import math
import random
import re
import shutil
from typing import Any

import _sources
import pytest
from _helpers import NVFP4_EXPERTS
from hostile.corpus import ERROR, OK, Expect, edit_header, judge, run_cli

#: dtypes by item size: a header may say any of a size's dtypes and still cover its bytes exactly
_SAME_SIZE = [
    ["BF16", "F16", "I16", "U16"],
    ["U8", "I8", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0"],
    ["F32", "I32", "U32"],
    ["F64", "I64", "U64"],
]


def _reshaped(shape: list[int], rng: random.Random) -> list[int]:
    """Another shape of as many elements."""
    numel = math.prod(shape)
    choices = [shape[::-1], [numel], [1, *shape], [n for n in shape if n != 1]]
    if shape and shape[0] % 2 == 0:
        choices.append([2, shape[0] // 2, *shape[1:]])
    if len(shape) >= 2:
        choices.append([shape[0] * shape[1], *shape[2:]])
    if numel == 1:
        choices.append([])
    return rng.choice(choices)


def _renamed(name: str, names: list[str], rng: random.Random) -> str:
    """A name the source should not have, or another tensor's."""
    return rng.choice([
        rng.choice(names),
        re.sub(r"experts\.\d+", "experts.999", name),
        re.sub(r"layers\.\d+", "layers.77", name),
        name.replace("weight", "weight_scale_inv"),
        name.replace("weight", "bias"),
        name.replace("_blocks", "_scales"),
        "model.extra.weight",
        name + "." * rng.randint(0, 1),
    ])  # fmt: skip


def _edit(header: dict[str, Any], rng: random.Random) -> None:
    """One lie that keeps the file well formed (every data byte covered by one entry, each entry's
    size its dtype and shape's), so what reads it must find it out from what the model says."""
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    entry = header[name]
    kind = rng.choice(["dtype", "shape", "rename", "swap-names", "swap-bytes", "meta"])
    if kind == "dtype":
        entry["dtype"] = rng.choice(next(g for g in _SAME_SIZE if entry["dtype"] in g))
    elif kind == "shape":
        entry["shape"] = _reshaped(list(entry["shape"]), rng)
    elif kind == "rename":
        new = _renamed(name, names, rng)
        if new not in header:
            header[new] = header.pop(name)
    elif kind == "swap-names":
        other = rng.choice(names)
        header[name], header[other] = header[other], header[name]
    elif kind == "swap-bytes":  # two entries of as many bytes trade places
        size = entry["data_offsets"][1] - entry["data_offsets"][0]
        same = [n for n in names if header[n]["data_offsets"][1] - header[n]["data_offsets"][0] == size]
        other = header[rng.choice(same)]
        entry["data_offsets"], other["data_offsets"] = other["data_offsets"], entry["data_offsets"]
    else:
        header["__metadata__"] = rng.choice([{"format": "tf"}, {"format": "np"}, {}, {"format": "pt", "x": "y"}])


_SOURCES = {
    "bf16": lambda plain, dst: plain,
    "fp8": lambda plain, dst: _sources.fp8_checkpoint(plain, dst, block=(32, 48)),
    "mxfp4": _sources.mxfp4_checkpoint,
}


@pytest.fixture(scope="module")
def sources(good_inputs, tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-headers")
    return {kind: make(good_inputs[0], root / kind) for kind, make in _SOURCES.items()}


@pytest.mark.parametrize("kind", sorted(_SOURCES))
@pytest.mark.parametrize("seed", range(20))
def test_a_lying_header_converts_what_it_says_or_is_refused(workspace, sources, kind, seed):
    ws = workspace
    shutil.rmtree(ws.src)
    shutil.copytree(sources[kind], ws.src)
    rng = random.Random(f"{kind}-{seed}")
    shard = rng.choice(sorted(ws.src.glob("*.safetensors")))
    edits = rng.choice([1, 1, 2, 3])

    def lie(header: dict[str, Any]) -> None:
        for _ in range(edits):
            _edit(header, rng)

    edit_header(shard, lie)
    before = ws.tree()
    outcome = run_cli(["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "-q"])
    if outcome.code == 0:
        judge(outcome, ws, before, Expect(OK))
        verified = run_cli(["verify", ws.dst, "--source", ws.src])
        assert verified.code == 0, verified.text()
    else:
        judge(outcome, ws, before, Expect(ERROR, r"\S"))
