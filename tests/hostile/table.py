"""The corpus table: which command meets which bad input, and what it must do there.

A command is an argv builder over a :class:`~hostile.corpus.Workspace`, in one of three tables by
the input it reads: a source checkpoint (:data:`ON_SOURCE`), a converted output
(:data:`ON_OUTPUT`) or a contract (:data:`ON_CONTRACT`). Every command meets every case of its
input kind; the default expectation is a refusal (:data:`~hostile.corpus.ERROR`) that says what
the case's ``says`` pattern says. :data:`DECISIONS` lists the pairs where a command legitimately
does something else, each with its reason: a report command fails with a report instead of an
error, or a command that never reads what the case broke succeeds.

To put a new command (``doctor``, a distributed run) under the corpus: add its argv builder to the
table of what it reads, and any decisions it makes to :data:`DECISIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from _helpers import NVFP4_EXPERTS
from hostile.cases import CONTRACT_CASES, EXPERT, OUTPUT_CASES, SOURCE_CASES, Case
from hostile.corpus import ERROR, FAILS, OK, USAGE, Expect, Workspace
from hostile.index_cases import INDEX_OUTPUT_CASES, INDEX_SOURCE_CASES
from hostile.source_format_cases import SOURCE_FORMAT_CASES

Argv = Callable[[Workspace], list[object]]

ON_SOURCE: dict[str, Argv] = {
    "convert": lambda ws: ["convert", ws.src, ws.dst, "--contract", NVFP4_EXPERTS, "-q"],
    "to-megatron": lambda ws: ["to-megatron", ws.src, ws.dst],
    "dequantize-source": lambda ws: ["dequantize", ws.src, ws.dst],
    "plan": lambda ws: ["plan", NVFP4_EXPERTS, "--model", ws.src, "--summary", "--json"],
    "explain": lambda ws: ["explain", NVFP4_EXPERTS, EXPERT, "--model", ws.src],
    "contract-check": lambda ws: ["contract", "check", NVFP4_EXPERTS, "--model", ws.src],
    "verify-source": lambda ws: ["verify", ws.out, "--source", ws.src],
    "validate-export-master": lambda ws: [
        "validate-export",
        ws.out,
        "--master",
        ws.src,
        "--contract",
        NVFP4_EXPERTS,
        "--include-input-scale",
    ],
}

ON_OUTPUT: dict[str, Argv] = {
    "verify": lambda ws: ["verify", ws.out],
    "dequantize": lambda ws: ["dequantize", ws.out, ws.dst],
    "publish-dry-run": lambda ws: ["publish", ws.out, "me/tiny-nvfp4", "--dry-run"],
    "doctor": lambda ws: ["doctor", ws.out],
    "validate-export-dump": lambda ws: [
        "validate-export",
        ws.out,
        "--master",
        ws.src,
        "--contract",
        NVFP4_EXPERTS,
        "--include-input-scale",
    ],
}

ON_CONTRACT: dict[str, Argv] = {
    "contract-check": lambda ws: ["contract", "check", ws.contract],
    "convert": lambda ws: ["convert", ws.src, ws.dst, "--contract", ws.contract, "-q"],
    "plan": lambda ws: ["plan", ws.contract, "--model", ws.src, "--summary"],
    "explain": lambda ws: ["explain", ws.contract, EXPERT],
    "diff": lambda ws: ["diff", ws.contract, NVFP4_EXPERTS, "--model", ws.src],
    "emit": lambda ws: ["contract", "emit", ws.contract, "--target", "te-yaml"],
    "to-megatron": lambda ws: ["to-megatron", ws.src, ws.dst, "--contract", ws.contract],
    "validate-export": lambda ws: [
        "validate-export",
        ws.out,
        "--master",
        ws.src,
        "--contract",
        ws.contract,
        "--include-input-scale",
    ],
}

_HEADERS_ONLY = "reads only names, shapes and dtypes from the headers; the data is not read"
_INDEX_UNUSED = "reads every *.safetensors of the master folder (symlinks checked); the index is not used"
_NOT_A_VERIFIER = "reads only the *.safetensors of the folder as an update dump; other files are no part of it"

_BAD_INDEX = [c for c in INDEX_OUTPUT_CASES if c.name in ("index-parent", "index-absolute", "index-missing-file")]

_ENGINE_VIEW = (
    "doctor judges what an engine loads (index, shards, tensors, scales, routing), not fp4convert's manifest, "
    "hashes or stray files: verify does"
)
_METADATA_UNREAD = (
    "the serving engines doctor judges for load tensors by name through safetensors (vLLM's and SGLang's weight "
    "iterators do not read the header metadata); transformers 4.x, which does, is verify's concern: it refuses it"
)
#: doctor is a report: a finding (exit 1) naming what it found, or exit 2 for a folder it cannot read
_DOCTOR: dict[str, Expect] = {
    "stray-file/safetensors": Expect(FAILS, r"error\[index/tensor-twice\]: tensors stored in two shards"),
    "truncated/output-shard": Expect(FAILS, r"error\[index/shard-unreadable\]: .*cover \d+ bytes"),
    "tampered/index": Expect(FAILS, r"error\[index/index-tensor-unlisted\].*\n  model\.norm\.weight"),
    "tampered/config-json": Expect(ERROR, r"config\.json is missing or not a JSON object", status=2),
    "missing/shard": Expect(FAILS, r"error\[index/shard-missing\]: .*names model-00002-of-00008\.safetensors"),
    "traversal/index-parent": Expect(
        FAILS, r"index-bad-name\]: .*'\.\./victim/evil\.safetensors'\); they were not read"
    ),
    "traversal/index-absolute": Expect(FAILS, r"index-bad-name\]: .*'/etc/passwd'\); they were not read"),
    "traversal/index-missing-file": Expect(FAILS, r"shard-missing\]: .*names model-00009-of-00008\.safetensors"),
    "traversal/index-listed-twice": Expect(FAILS, rf"index-unreadable\]: .*cannot be used: it lists '{EXPERT}' twice"),
    "traversal/index-symlink-out": Expect(FAILS, r"index-unreadable\]: .*index\.json resolves to .*outside"),
    **{
        case: Expect(OK, why=_ENGINE_VIEW)
        for case in (
            "stray-file/python",
            "stray-file/tmp",
            "stray-file/folder",
            "traversal/symlink-into-source",
            "traversal/manifest-names-parent",
            "tampered/manifest-sha",
            "tampered/manifest-contract",
            "tampered/manifest-field",
            "tampered/manifest-shape-type",
            "truncated/manifest",
            "tampered/output-byte",
            "tampered/copied-file",
            "missing/manifest",
        )
    },
    "tampered/shard-metadata": Expect(OK, why=_METADATA_UNREAD),
    "tampered/scale-names-traded": Expect(FAILS, r"error\[structure/dtype-mismatch\]: .*\n.*up_proj\.weight_scale"),
}

#: (command, case id or family) -> what the command does instead of refusing with ``case.says``
DECISIONS: dict[tuple[str, str], Expect] = {
    # non-finite data: only what reads (and quantizes) the data can tell
    **{(c, "nonfinite"): Expect(OK, why=_HEADERS_ONLY) for c in ("plan", "explain", "contract-check")},
    # a scale's value (NaN, zero, not a power of two) is data too: the header-only commands cannot see it
    **{
        (c, f"source-format/{name}"): Expect(OK, why=_HEADERS_ONLY)
        for c in ("plan", "explain", "contract-check")
        for name in ("fp8-nan-scale", "fp8-zero-scale", "ue8m0-not-power-of-two")
    },
    ("to-megatron", "nonfinite"): Expect(OK, why="copies the BF16 master bit for bit: the learner trains on it as is"),
    ("verify-source", "nonfinite"): Expect(FAILS, r"FAIL source .*bytes differ"),
    ("validate-export-master", "nonfinite"): Expect(FAILS, r"FAIL"),
    # dequantize of a plain BF16 source has nothing to decode: once the folder opens, it refuses on
    # that ground before reading a tensor (what else is wrong with the tensors, convert names)
    **{
        ("dequantize-source", case): Expect(ERROR, r"config\.json has no quantization_config of a known dialect")
        for case in (
            "nonfinite",
            *(
                f"config/{name}"
                for name in (
                    "more-layers",
                    "fewer-layers",
                    "hidden-size",
                    "more-experts",
                    "vocab",
                    "moe-intermediate",
                    "trillion-experts",
                    "layers-huge",
                    "zero-kv-heads",
                    "zero-sparse-step",
                    "negative-layers",
                    "unknown-model",
                    "gemm-missing",
                    "int32-norm",
                    "int8-weight",
                    "bool-weight",
                    "1d-linear",
                    "empty-tensor",
                )
            ),
        )
    },
    # the master of validate-export is a folder of safetensors, not an index; its config.json is
    # read where it is (a symlink is as good as --config pointing there); a master that disagrees
    # with its config is a failed report naming the tensor, not an error
    **{
        ("validate-export-master", case): Expect(OK, why=_INDEX_UNUSED)
        for case in (
            "truncated/index",
            "lying-header/index-wrong-shard",
            "lying-header/index-no-map",
            "traversal/index-parent",
            "traversal/index-absolute",
            "traversal/index-not-string",
            "traversal/side-file-symlink-out",
            "traversal/config-symlink-out",
            "config/absent-from-index",
            "traversal/index-missing-file",
            "traversal/index-listed-twice",
            "traversal/index-symlink-out",
        )
    },
    **{
        ("validate-export-master", f"config/{name}"): Expect(
            FAILS, r"FAIL master .*config says|FAIL master .*no tensor"
        )
        for name in (
            "more-layers",
            "hidden-size",
            "more-experts",
            "vocab",
            "moe-intermediate",
            "gemm-missing",
            "1d-linear",
            "empty-tensor",
        )
    },
    ("validate-export-master", "config/fewer-layers"): Expect(
        ERROR, r"model\.layers\.2\..* is not a qwen3_moe tensor"
    ),
    ("validate-export-master", "config/not-an-object"): Expect(ERROR, r"config\.json holds a JSON list"),
    ("validate-export-master", "config/in-two-shards"): Expect(ERROR, r"'lm_head\.weight' is stored in more than one"),
    ("validate-export-master", "config/pickle-only"): Expect(ERROR, r"holds no \*\.safetensors files"),
    **{
        ("validate-export-master", f"config/{name}"): Expect(ERROR, rf"master tensor '{tensor}' is {dtype}, not BF16")
        for name, tensor, dtype in (
            ("int32-norm", "model.layers.0.post_attention_layernorm.weight", "I32"),
            ("int8-weight", EXPERT, "I8"),
            ("bool-weight", EXPERT, "BOOL"),
            ("fp8-weight", EXPERT, "F8_E4M3"),
        )
    },
    # verify is a report: what it finds in a tampered output is a failed check, named
    **{
        ("verify", case.id): Expect(FAILS, case.says)
        for case in OUTPUT_CASES
        if case.family in ("stray-file", "traversal", "tampered", "truncated", "missing")
        and case.name not in ("manifest", "manifest-field", "manifest-shape-type")
    },
    # publish lists the folder before it verifies it: a folder is named as such
    ("publish-dry-run", "stray-file/folder"): Expect(ERROR, r"holds a folder extra/, which fp4convert does not write"),
    # dequantize opens the folder as a checkpoint first: what that refuses is refused as for any source
    ("dequantize", "traversal/symlink-into-source"): Expect(ERROR, r"tokenizer\.json resolves to .*outside"),
    ("dequantize", "truncated/output-shard"): Expect(ERROR, r"cover \d+ bytes"),
    ("dequantize", "tampered/config-json"): Expect(ERROR, r"config\.json: not readable JSON"),
    ("dequantize", "tampered/index"): Expect(ERROR, r"holds 'model\.norm\.weight', which .*index\.json does not list"),
    ("dequantize", "missing/manifest"): Expect(
        OK,
        why="dequantize reads any dialect's checkpoint, fp4convert's or not: without a manifest nothing is recorded",
    ),
    # an output's index that names other files: verify compares it with the manifest (a failed check);
    # dequantize opens the folder as a checkpoint, which refuses the index as for any source
    **{
        ("verify", case.id): Expect(FAILS, r"FAIL index .*weight_map differs from the manifest") for case in _BAD_INDEX
    },
    ("verify", "traversal/index-listed-twice"): Expect(FAILS, rf"FAIL index .*lists '{EXPERT}' twice"),
    ("verify", "traversal/index-symlink-out"): Expect(FAILS, r"FAIL extra-file .*index\.json: a symlink"),
    **{("dequantize", case.id): Expect(ERROR, case.says) for case in INDEX_OUTPUT_CASES},
    # an output used as an update dump: only its tensors count
    **{
        ("validate-export-dump", case.id): Expect(OK, why=_NOT_A_VERIFIER)
        for case in OUTPUT_CASES + INDEX_OUTPUT_CASES
        if case.id
        not in (
            "stray-file/safetensors",
            "tampered/output-byte",
            "tampered/scale-names-traded",
            "truncated/output-shard",
            "missing/shard",
        )
    },
    ("validate-export-dump", "tampered/scale-names-traded"): Expect(FAILS, r"FAIL dtype .*up_proj\.weight_scale"),
    ("validate-export-dump", "stray-file/safetensors"): Expect(FAILS, r"FAIL duplicate .*model-extra\.safetensors"),
    ("validate-export-dump", "tampered/output-byte"): Expect(FAILS, r"FAIL"),
    ("validate-export-dump", "truncated/output-shard"): Expect(ERROR, r"cover \d+ bytes"),
    ("validate-export-dump", "missing/shard"): Expect(FAILS, r"FAIL missing"),
    **{("doctor", case): expect for case, expect in _DOCTOR.items()},
    # click refuses a directory where a contract file belongs before any command runs
    **{
        (command, "contract/directory"): Expect(USAGE, r"contracts\.d' is a directory")
        for command in ("contract-check", "plan", "explain", "diff", "emit")
    },
}

_PUBLISH_REFUSAL = r"does not verify, so it is not published"
_DEQUANTIZE_REFUSAL = r"does not match its fp4convert\.json"


def _default(command: str, case: Case, kind: str) -> Expect:
    """The refusal a command gives on a case when no decision says otherwise."""
    if (
        kind == "output"
        and case.family != "missing"
        and case.name not in ("manifest", "manifest-field", "manifest-shape-type")
    ):
        if command == "publish-dry-run":
            return Expect(ERROR, _PUBLISH_REFUSAL)
        if command == "dequantize":
            return Expect(ERROR, _DEQUANTIZE_REFUSAL)
    if (
        kind == "output"
        and case.family == "missing"
        and case.name == "shard"
        and command in ("publish-dry-run", "dequantize")
    ):
        return Expect(ERROR, r"missing")
    return Expect(ERROR, case.says)


def pairs() -> Iterator[tuple[str, str, Case, Expect]]:
    """Every (input kind, command, case, expectation) of the corpus."""
    for kind, commands, cases in (
        ("source", ON_SOURCE, SOURCE_CASES + INDEX_SOURCE_CASES + SOURCE_FORMAT_CASES),
        ("output", ON_OUTPUT, OUTPUT_CASES + INDEX_OUTPUT_CASES),
        ("contract", ON_CONTRACT, CONTRACT_CASES),
    ):
        for command in commands:
            for case in cases:
                expect = DECISIONS.get((command, case.id)) or DECISIONS.get((command, case.family))
                yield kind, command, case, expect or _default(command, case, kind)
