"""Static SASS instruction counts of the NVFP4 kernels for sm_90, compiled without a GPU, against another
revision's kernels compiled the same way.

Triton compiles for a named target with its own ptxas, and its nvdisasm lists the machine code, so
this runs on any machine with the dev extra. The counts are static (each instruction of the kernel
once, loops not multiplied out; "loop" counts the longest loop's, what each step issues, "alu" those
of them the ALU pipe issues (ALU_OPS), "bar" the barriers in it), a check of what a kernel change
does to the code; speed is measured on the device (bench/device/nvfp4_ab.py, bench/live_sync.py).

    python bench/kernel_sass.py [--against REV] [--top 12]
    FP4CONVERT_E2M1_PACK=horner python bench/kernel_sass.py   # a kernel flag (read at import) set
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = "loop"  # the counts' key for the longest loop's instructions (not an operation)
LOOP_BARRIERS = "loop barriers"  # and for the barriers (BAR) among them: each holds a program's warps together
LOOP_ALU = "loop alu"  # and for those of them that issue to the ALU pipe (ALU_OPS)
#: operations sm_90 issues to its ALU pipe, as Nsight Compute's pipeline descriptions put it (logic,
#: shifts, integer arithmetic other than multiply-adds, comparisons, minima and maxima, selects): 16
#: lanes per SM quarter, half the rate of FP32 arithmetic, and where the NVFP4 encode spends most of
#: its instructions. IMAD (moves and shifts by it included) and FP32 arithmetic take the FMA pipes;
#: where ptxas's VIADD goes is not documented, so it is not counted.
ALU_OPS = frozenset(
    {"LOP3", "SHF", "LEA", "IADD3", "ISETP", "IMNMX", "VIMNMX", "FMNMX", "FSETP", "FSEL", "SEL", "PRMT", "IABS",
     "PLOP3", "VHMNMX", "HMNMX2", "FLO", "POPC", "BREV"}
)  # fmt: skip
# count the kernels as they run with every path on: this tree's kernels take the word path as WORDS;
# revisions before stop 37 read this variable in the kernels (the other revision's subprocess inherits it)
os.environ.setdefault("FP4CONVERT_BF16_WORDS", "1")


def _kernels() -> dict[str, tuple[object, dict[str, str], dict[str, object]]]:
    """name -> (jit function, argument types, constexprs) of the kernels counted."""
    import triton.language as tl

    from fp4convert.formats import _triton_segments as ts

    dense = {"x_ptr": "*bf16", "ld": "i32", "rows": "i32", "amax_ptr": "*fp32", "data_ptr": "*u8",
             "scale_ptr": "*u8", "cols": "i32", "unit_rows": "i32"}  # fmt: skip
    # CH 4: the launch of a large weight (NVFP4_LARGE_STEPS); with 2 steps ptxas may unroll the loop,
    # which doubles the static count without changing what one step issues
    dense_k = {"GMAX": 2688.0, "TILE16": False, "EVEN_R": True, "EVEN_C": True, "BR": 16, "BC": 256, "CH": 4,
               "REVERSE": True, "HW": True, "WORDS": True}  # fmt: skip
    seg = {"tab_ptr": "*i32", "src_ptr": "*i64", "ld_ptr": "*i64", "rows_ptr": "*i32", "out_ptr": "*i32",
           "unit_ptr": "*i32", "amax_ptr": "*fp32", "data_ptr": "*u8", "scale_ptr": "*u8", "cols": "i32",
           "bad_ptr": "*i32"}  # fmt: skip
    seg_k = {"DT": tl.bfloat16, "PROFILE": 0, "GMAX": 2688.0, "TILE16": False, "EVEN_R": True, "EVEN_C": True,
             "BR": 16, "BC": 256, "CH": 0, "HW": True, "WORDS": True}  # fmt: skip
    tensor = {**{k: v for k, v in dense.items() if k != "unit_rows"}, "nprog": "i32"}
    tensor_k = {**{k: v for k, v in dense_k.items() if k not in ("CH", "REVERSE")}, "PROFILE": 0, "PDL": False,
                "IN_POLICY": "", "OUT_POLICY": ""}  # fmt: skip
    amax = {"x_ptr": "*bf16", "ld": "i32", "rows": "i32", "out_ptr": "*i32", "keep_from": "i32", "cols": "i32",
            "nprog": "i32"}  # fmt: skip
    evict_pdl = {"PREFETCH": False, "PDL": True, "IN_POLICY": "evict_first", "OUT_POLICY": "evict_first"}
    amax_k = {"EVEN_R": True, "EVEN_C": True, "BR": 16, "BC": 256, "KEEP": False, "PDL": False}
    return {
        "nvfp4 dense, te": (ts._nvfp4_dense_kernel, dense, {"PROFILE": 0, **dense_k}),
        "nvfp4 dense, modelopt": (ts._nvfp4_dense_kernel, dense, {**dense_k, "PROFILE": 2, "WORDS": False}),
        "nvfp4 tensor, persistent": (ts._nvfp4_tensor_kernel, tensor, {**tensor_k, "PREFETCH": False}),
        "nvfp4 tensor, prefetch": (ts._nvfp4_tensor_kernel, tensor, {**tensor_k, "PREFETCH": True}),
        "nvfp4 tensor, pdl, evict_first": (ts._nvfp4_tensor_kernel, tensor, {**tensor_k, **evict_pdl}),
        "amax tensor, persistent": (ts._amax_dense_kernel, amax, amax_k),
        "amax tensor, kept in L2, pdl": (ts._amax_dense_kernel, amax, {**amax_k, "KEEP": True, "PDL": True}),
        "nvfp4 segments, write": (ts._nvfp4_seg_kernel, seg, {**seg_k, "VERIFY": False, "PREFETCH": False}),
        "nvfp4 segments, compare": (ts._nvfp4_seg_kernel, seg, {**seg_k, "VERIFY": True, "PREFETCH": False}),
        "nvfp4 seg. write, prefetch": (ts._nvfp4_seg_kernel, seg, {**seg_k, "VERIFY": False, "PREFETCH": True}),
        "nvfp4 seg. compare, prefetch": (ts._nvfp4_seg_kernel, seg, {**seg_k, "VERIFY": True, "PREFETCH": True}),
    }


def _count(fn: object, args: dict[str, str], constexprs: dict[str, object]) -> collections.Counter[str]:
    import triton
    from triton.backends.compiler import GPUTarget

    # in the kernel's order (the signature is positional); a constexpr another revision's kernel does
    # not declare yet (HW) is left out there
    constexprs = {k: constexprs[k] for k in fn.arg_names if k in constexprs}  # type: ignore[attr-defined]
    names = [*args, *constexprs]
    source = triton.compiler.ASTSource(
        fn=fn,
        signature={**args, **dict.fromkeys(constexprs, "constexpr")},
        constexprs={(names.index(k),): v for k, v in constexprs.items()},
        # as Triton specializes a launch: pointers 16-byte aligned, integers multiples of 16 (a
        # 4096x14336 weight, 768x2048 experts); without it the layouts and vector widths differ
        # (not the grid's size of a persistent kernel: it is not specialized)
        attrs={(i,): [["tt.divisibility", 16]] for i, name in enumerate(args) if name != "nprog"},
    )
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        listing = subprocess.run([str(nvdisasm), "-c", cubin.name], capture_output=True, text=True, check=True).stdout
    sequence: list[str] = []  # the operations in the listing's order
    labels: dict[str, int] = {}  # label -> index of the instruction that follows it
    loop: list[str] = []  # the longest loop (a branch back to a label above it): what a step issues
    for line in listing.splitlines():
        if label := re.match(r"(\.L_x_\d+):", line):
            labels[label.group(1)] = len(sequence)
        found = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if found:
            sequence.append(found.group(1))
            back = re.search(r"BRA\s.*`\((\.L_x_\d+)\)", line)
            start = labels.get(back.group(1)) if back else None  # a branch back: the loop's first instruction
            if start is not None and len(sequence) - start > len(loop):
                loop = sequence[start:]
    ops = collections.Counter(sequence)
    ops[LOOP] = len(loop)
    ops[LOOP_BARRIERS] = loop.count("BAR")
    ops[LOOP_ALU] = sum(op in ALU_OPS for op in loop)
    return ops


def counts() -> dict[str, dict[str, int]]:
    return {name: dict(_count(*spec)) for name, spec in _kernels().items()}


def _other_revision(rev: str) -> dict[str, dict[str, int]]:
    """The same counts for ``rev``'s package, in a subprocess importing it from a git archive."""
    archive = subprocess.run(["git", "archive", rev, "fp4convert"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tree:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        env = {**os.environ, "PYTHONPATH": tree}
        done = subprocess.run(
            [sys.executable, __file__, "--print-json"], env=env, capture_output=True, text=True, check=True
        )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", default=None, help="another revision (git), compiled the same way")
    parser.add_argument("--top", type=int, default=12, help="operations listed per kernel")
    parser.add_argument("--print-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    here = counts()
    if args.print_json:
        print(json.dumps(here))
        return
    there = _other_revision(args.against) if args.against else {}
    print(f"static SASS instructions, sm_90 (Triton's ptxas), this tree{f' against {args.against}' if there else ''}")
    print(f"{'':26} {'total':>6} {'loop':>6} {'alu':>4} {'bar':>4}")
    for name, ops in here.items():
        loop, alu, bars = ops.pop(LOOP, 0), ops.pop(LOOP_ALU, 0), ops.pop(LOOP_BARRIERS, 0)
        total = sum(ops.values())
        line = f"{name:26} {total:6d} {loop:6d} {alu:4d} {bars:4d}"
        if there:
            theirs = there[name]
            before_loop, before_bars = theirs.pop(LOOP, 0), theirs.pop(LOOP_BARRIERS, 0)
            before_alu = theirs.pop(LOOP_ALU, 0)
            before = sum(theirs.values())
            change = f"{total / before:.3f}x, loop {loop - before_loop:+d}"
            line += f"  {args.against}: {before:6d} {before_loop:6d} {before_alu:4d} {before_bars:4d}  ({change})"
        print(line)
        changed = sorted(set(ops) | set(there.get(name, {})), key=lambda o: -ops.get(o, 0))[: args.top]
        cells = [f"{o} {ops.get(o, 0)}" + (f" ({there[name].get(o, 0)})" if there else "") for o in changed]
        print("    " + ", ".join(cells))


if __name__ == "__main__":
    main()
