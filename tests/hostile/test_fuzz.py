"""Fuzzing the readers of untrusted files, in bounded time: a real shard with its bytes mutated, a
real index with its entries replaced, contract text of random YAML. Each reader either reads what
is there or raises one fp4convert error; nothing else escapes, nothing is read outside the source.

(The header grammar itself is fuzzed against the safetensors library in
``tests/checkpoint/test_safetensors_io.py``; these start from real files and go through the whole
path a command takes.)
"""

from __future__ import annotations

import json
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, read_header
from fp4convert.checkpoint.source import open_checkpoint
from fp4convert.contract import parse_contract
from fp4convert.errors import CheckpointError, ContractError, Fp4ConvertError
from fp4convert.megatron.sources import SafetensorsFolder

_BOUNDED = settings(
    max_examples=120, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True
)


@pytest.fixture(scope="module")
def shard(good_inputs) -> bytes:
    return sorted(good_inputs[0].glob("*.safetensors"))[2].read_bytes()


_mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 40_000)),
    st.tuples(st.just("byte"), st.integers(0, 600), st.integers(0, 255)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("insert"), st.integers(8, 600), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("zero-tail"), st.integers(1, 4096)),
)


def _mutate(blob: bytes, steps: list[tuple]) -> bytes:
    for step in steps:
        kind = step[0]
        if kind == "truncate":
            blob = blob[: step[1]]
        elif kind == "byte" and step[1] < len(blob):
            blob = blob[: step[1]] + bytes([step[2]]) + blob[step[1] + 1 :]
        elif kind == "length" and len(blob) >= 8:
            blob = struct.pack("<Q", step[1]) + blob[8:]
        elif kind == "insert":
            blob = blob[: step[1]] + step[2] + blob[step[1] :]
        elif kind == "zero-tail":
            blob = blob[: -step[1]] + bytes(min(step[1], len(blob)))
    return blob


@_BOUNDED
@given(steps=st.lists(_mutation, min_size=1, max_size=3))
def test_a_mutated_shard_is_read_whole_or_refused(shard, tmp_path, steps):
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(_mutate(shard, steps))
    try:
        entries, _ = read_header(path)
    except CheckpointError:
        return
    size = path.stat().st_size
    with SafetensorsFile(path) as f:
        for entry in entries.values():
            assert 0 <= entry.start <= entry.end <= size
            assert f.read_bytes(entry.name).numel() == entry.nbytes  # every declared byte is there


_names = st.one_of(
    st.sampled_from(["../victim/evil.safetensors", "/etc/passwd", "..", "", "a/b.safetensors", "x\0.safetensors"]),
    st.text(min_size=0, max_size=12),
    st.integers(),
    st.none(),
    st.lists(st.text(max_size=3), max_size=2),
)


@_BOUNDED
@given(entries=st.dictionaries(st.text(max_size=40), _names, max_size=4), drop=st.booleans())
def test_a_crafted_index_opens_within_the_source_or_is_refused(good_inputs, tmp_path_factory, entries, drop):
    root = tmp_path_factory.mktemp("fuzz-index")
    src = root / "src"
    shutil.copytree(good_inputs[0], src)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    if drop:
        index["weight_map"] = entries
    else:
        index["weight_map"].update(entries)
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    try:
        ckpt = open_checkpoint(src)
    except CheckpointError:
        return
    for name in ckpt.shards:  # whatever opened is a plain file of the source folder
        assert "/" not in name and (src / name).resolve().parent == src.resolve()
    ckpt.inventory()


@_BOUNDED
@given(steps=st.lists(_mutation, min_size=1, max_size=2), symlink=st.booleans())
def test_a_mutated_dump_folder_is_read_or_refused(shard, tmp_path_factory, steps, symlink):
    dump = tmp_path_factory.mktemp("fuzz-dump")
    (dump / "update-0.safetensors").write_bytes(_mutate(shard, steps))
    if symlink:
        outside = dump.parent / f"{dump.name}-outside.safetensors"
        outside.write_bytes(shard)
        (dump / "update-1.safetensors").symlink_to(outside)
    try:
        with SafetensorsFolder(dump) as folder:
            for name in folder:
                folder[name]
    except CheckpointError as exc:
        if symlink:
            assert "outside" in str(exc) or "not a valid safetensors" in str(exc) or "too short" in str(exc)
        return
    assert not symlink


_yaml_bits = st.sampled_from(
    [
        "version: 1\n",
        "name: x\n",
        "default: bf16\n",
        "rules:\n",
        "  - ",
        "{kind: regex, namespace: hf, ",
        "pattern: '(a+)+$', ",
        "format: nvfp4}\n",
        "&a [x, x]\n",
        "*a\n",
        "!!python/object:os.system\n",
        "[[[",
        "]]]",
        "{",
        "}",
        ": ",
        "- ",
        "'",
        '"',
        "\t",
        "\x00",
        "\\1",
        "(?=x)",
        "\n",
        "bf16_exceptions: {norms: true}\n",
    ]
)


@_BOUNDED
@given(parts=st.lists(_yaml_bits, max_size=25), json_text=st.booleans())
def test_random_contract_text_parses_or_is_one_contract_error(parts, json_text):
    try:
        parse_contract("".join(parts), json_text=json_text)
    except ContractError:
        pass
    except Fp4ConvertError as exc:  # pragma: no cover - a contract error of another class is a bug
        raise AssertionError(f"{type(exc).__name__}: {exc}") from exc
