"""The one safetensors header reader: what it accepts equals the safetensors library; every
malformed header is one CheckpointError naming the file (and tensor), never another exception."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from fp4convert.checkpoint.safetensors_io import SafetensorsFile, StreamingWriter, read_header
from fp4convert.errors import CheckpointError
from fp4convert.inventory.dtypes import SAFETENSORS_DTYPES


def _raw(path, header, data: bytes = b"") -> None:
    """Write a safetensors file by hand: ``header`` (an object, or raw bytes) then ``data``."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _f32(name: str, begin: int, count: int) -> dict:
    return {name: {"dtype": "F32", "shape": [count], "data_offsets": [begin, begin + 4 * count]}}


def test_round_trip_with_every_dtype_of_the_table(tmp_path):
    tensors = {
        code: torch.arange(6, dtype=torch.uint8).view(-1)[: 6 - 6 % dtype.itemsize].view(dtype)
        for code, dtype in SAFETENSORS_DTYPES.items()
    }
    path = tmp_path / "all.safetensors"
    writer = StreamingWriter(path, [(code, code, tuple(t.shape)) for code, t in tensors.items()], {"k": "v"})
    for code, tensor in tensors.items():
        writer.write(code, tensor)
    writer.close()
    entries, metadata = read_header(path)
    assert metadata == {"k": "v"} and [e.dtype for e in entries.values()] == list(tensors)
    with SafetensorsFile(path) as f:
        for code, tensor in tensors.items():
            assert torch.equal(f.read(code).view(torch.uint8), tensor.view(torch.uint8))
            assert f.read(code).dtype == tensor.dtype
    assert "F8_E8M0" in entries  # the table the other reader used to lack


def test_entries_come_in_data_order_and_empty_tensors_are_fine(tmp_path):
    path = tmp_path / "x.safetensors"
    empty = {"dtype": "BF16", "shape": [0, 4], "data_offsets": [12, 12]}
    header = {**_f32("b", 0, 1), **_f32("a", 4, 2), "empty": empty}
    _raw(path, header, bytes(12))
    entries, _ = read_header(path)
    assert list(entries) == ["b", "a", "empty"] and entries["empty"].nbytes == 0


@pytest.mark.parametrize(
    ("header", "data", "message", "tensor"),
    [
        ([1, 2], b"", r"is a JSON list, not an object", None),
        (b"\xff\xfe", b"", r"not JSON", None),
        (b"{not json", b"", r"not JSON", None),
        ({"w": 3}, b"", r"entry of tensor 'w' is not an object", "w"),
        ({"w": {"dtype": "F32", "shape": [1]}}, bytes(4), r"'w' has no data_offsets", "w"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": ["0", "4"]}}, bytes(4), r"not two non-negative", "w"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, bytes(4), r"does not fit", "w"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, bytes(4), r"shape \[-1\]", "w"),
        ({"w": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, bytes(4), r"shape \[1.0\]", "w"),
        ({"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, bytes(4), r"shape \[True\]", "w"),
        ({"w": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}}, bytes(4), r"unsupported dtype 'Q4'", "w"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, bytes(4), r"does not fit", "w"),
        ({**_f32("a", 0, 2), **_f32("b", 4, 1)}, bytes(8), r"'b' at data offset 4 overlaps", "b"),
        ({**_f32("a", 0, 1), **_f32("b", 8, 1)}, bytes(12), r"'b' at data offset 8 leaves a hole", "b"),
        (_f32("a", 0, 1), bytes(8), r"cover 4 bytes of a 8-byte data section", None),
        (_f32("a", 0, 2), bytes(4), r"cover 8 bytes of a 4-byte data section", None),
        ({"__metadata__": {"n": 1}, **_f32("a", 0, 1)}, bytes(4), r"__metadata__ is not an object of strings", None),
        ({"__metadata__": [], **_f32("a", 0, 1)}, bytes(4), r"__metadata__", None),
    ],
)
def test_malformed_headers_are_one_checkpoint_error(tmp_path, header, data, message, tensor):
    path = tmp_path / "bad.safetensors"
    _raw(path, header, data)
    with pytest.raises(CheckpointError, match=message) as info:
        read_header(path)
    assert info.value.fields["file"] == str(path) and info.value.fields.get("tensor") == tensor
    with pytest.raises(SafetensorError), safe_open(str(path), "pt") as f:  # the library refuses it too
        [f.get_slice(k) for k in f.keys()]


def test_a_tensor_listed_twice_is_named(tmp_path):
    path = tmp_path / "dup.safetensors"
    one = json.dumps(_f32("w", 0, 1))[1:-1]
    _raw(path, ("{" + one + "," + one + "}").encode(), bytes(4))
    with pytest.raises(CheckpointError, match=r"tensor 'w' is listed twice") as info:
        read_header(path)
    assert info.value.fields["tensor"] == "w"


def test_a_field_given_twice_inside_an_entry_is_not_mistaken_for_a_tensor(tmp_path):
    path = tmp_path / "dup-field.safetensors"
    _raw(path, b'{"w": {"dtype": "F32", "dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4))
    with pytest.raises(CheckpointError, match=r"the header entry of 'w' gives 'dtype' twice"):
        read_header(path)


@pytest.mark.parametrize("content", [b"", b"\x01\x02", struct.pack("<Q", 1 << 40), struct.pack("<Q", 100) + b"{}"])
def test_truncated_files(tmp_path, content):
    path = tmp_path / "short.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=r"too short|exceeds the file size"):
        read_header(path)


def test_agrees_with_the_library_on_files_it_writes(tmp_path):
    tensors = {"z": torch.ones(3, 5), "a": torch.zeros(2, dtype=torch.bfloat16), "m": torch.arange(7)}
    path = tmp_path / "lib.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    entries, metadata = read_header(path)
    assert metadata == {"format": "pt"}
    with SafetensorsFile(path) as f, safe_open(str(path), "pt") as lib:
        assert sorted(entries) == sorted(lib.keys())
        for name in entries:
            assert torch.equal(f.read(name), lib.get_tensor(name))


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
_entries = st.dictionaries(
    st.text(max_size=5),
    st.fixed_dictionaries(
        {"dtype": st.sampled_from(["F32", "U8", "BF16", "X"]), "shape": st.lists(st.integers(-1, 3), max_size=2)},
        optional={"data_offsets": st.lists(st.integers(-1, 24), min_size=0, max_size=3)},
    )
    | _json,
    max_size=4,
)


def _same_verdict_as_the_library(tmp_path, header, data) -> None:
    path = tmp_path / "fuzz.safetensors"
    _raw(path, header, data)
    try:
        entries, _ = read_header(path)
    except CheckpointError:
        accepted = False
    else:
        accepted = True
    try:
        with safe_open(str(path), "pt") as f:
            names = set(f.keys())
        library = True
    except SafetensorError:
        library = False
    assert accepted == library, header
    if accepted:
        assert set(entries) == names


@st.composite
def _near_valid(draw: st.DrawFn) -> tuple[dict, bytes]:
    """A well-formed layout of a few tensors, then maybe one field nudged (the interesting border)."""
    header: dict = {}
    offset = 0
    for n in range(draw(st.integers(0, 3))):
        dtype = draw(st.sampled_from(["F32", "U8", "BF16", "F8_E8M0"]))
        shape = draw(st.lists(st.integers(0, 3), max_size=2))
        size = SAFETENSORS_DTYPES[dtype].itemsize
        for d in shape:
            size *= d
        header[f"t{n}"] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    if header and draw(st.booleans()):
        entry = header[draw(st.sampled_from(sorted(header)))]
        key = draw(st.sampled_from(["shape", "data_offsets"]))
        entry[key] = [v + draw(st.integers(-1, 1)) for v in entry[key]]
    return header, bytes(offset + draw(st.sampled_from([0, 0, 1])))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_near_valid())
def test_near_valid_headers_are_judged_as_the_library_judges_them(tmp_path, case):
    _same_verdict_as_the_library(tmp_path, *case)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=_entries | _json, data=st.binary(max_size=24))
def test_fuzzed_headers_parse_or_raise_checkpoint_error_as_the_library_decides(tmp_path, header, data):
    _same_verdict_as_the_library(tmp_path, header, data)


def test_read_header_parses_a_changed_header_again(tmp_path, monkeypatch):
    # Parsed headers are cached by their bytes: the same bytes are served from the cache, a header
    # rewritten in place (same file size, within the file system's timestamp granularity) is not.
    from fp4convert.checkpoint import safetensors_io

    path = tmp_path / "a.safetensors"
    entries = {name: {"dtype": "F32", "shape": [2], "data_offsets": [i * 8, i * 8 + 8]} for i, name in enumerate("ab")}
    header = json.dumps(entries).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    first = read_header(path)[0]
    parsed = []
    real = safetensors_io._parse_header
    monkeypatch.setattr(safetensors_io, "_parse_header", lambda *args: parsed.append(1) or real(*args))
    assert read_header(path)[0] == first and not parsed
    with path.open("r+b") as f:
        f.seek(8)
        f.write(header.replace(b'"a"', b'"c"'))
    assert sorted(read_header(path)[0]) == ["b", "c"] and parsed == [1]
