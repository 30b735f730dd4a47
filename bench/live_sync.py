"""Live weight sync at HBM speed (issue 15): export_hf, validate_export and the quantize kernels.

Builds a Qwen3-30B-A3B-shaped master directly on the device (``--layers`` decoder layers of 128
experts, Megatron-Core names as the learner holds them, random BF16 values; no files), then prints:

* the device-to-device copy bandwidth (bytes read + written): the roofline every row is put against;
* ``export_hf``: the first call of the process (plan build and kernel compilation included), the
  steady state (2nd+ call) of the master's ``items()`` (one whole update, replayed on a GPU) and of
  an iterator over them (streamed group by group, eager), and the first call of a new exporter once
  the plan is cached and the kernels compiled; the reusable ``LiveExporter`` (whole update in plan
  order, and in 1 GB buckets; on a GPU replayed as one CUDA graph, and the same steady state issued
  kernel by kernel);
* ``validate_export`` of that export: first call (its plan and layouts built), steady state (the byte
  check replayed as one CUDA graph on a GPU) and, on a GPU, the same steady state issued kernel by kernel;
* the kernels: NVFP4 1x16 / 16x16 / row-scaled and MXFP8 row / col on one 14336x4096 weight, NVFP4 on
  one layer's 128 expert ``linear_fc1`` weights stacked (196608x2048: gate and up), one call each, and
  one grouped launch reading the 128 separate tensors in place;
* a byte check of a sample of the export against the CPU reference (the converter's arithmetic on
  the CPU), and that validate_export passed.

GB/s is of BF16 input (master bytes for export / validate). ``% roofline`` compares the bytes a
step must move at least (input read once, output written once) with the copy bandwidth. A sync
(export, validate) is timed one synchronized call at a time; a kernel row per call, with the calls
issued back to back (as a sync issues them) for at least 25 ms, best of ``--repeat``.

    python bench/live_sync.py [--device cuda|cpu] [--layers N] [--repeat R] [--contract C] [--dialect D] [--json]

On the 2-core CPU use ``--device cpu --layers 1``: it also prints export's throughput against the
CPU quantize kernel's on the same expert weights.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from fp4convert import export_hf, validate_export
from fp4convert.families import hf_to_megatron, inventory_from_config, load_config
from fp4convert.formats.mxfp8 import quantize_mxfp8
from fp4convert.formats.nvfp4 import quantize_nvfp4
from fp4convert.formats.segments import SegmentLayout, Sources, nvfp4_segments, unit_amax
from fp4convert.megatron import export_plan
from fp4convert.megatron.encode import encode_group
from fp4convert.megatron.sync import LiveExporter
from fp4convert.megatron.validate import ExportValidator

GB = 1e9
#: new exporters / validators each first-call row takes the median of (a single first call varies by
#: up to 1.4x between runs on one machine: bench/results/live-sync-h100-36-layers-stop44.txt)
FIRST_CALLS = 3
#: sections that failed (the script exits non-zero after printing everything else)
FAILED: list[str] = []
#: elements of the copy that measures the roofline: 2 GB of BF16 on the GPU, 0.25 GB on the CPU
COPY_ELEMENTS = {True: 1_000_000_000, False: 125_000_000}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(fn: Callable[[], object], device: str, repeat: int, warmup: int = 1) -> float:
    """Best wall time of ``repeat`` calls (after ``warmup``), synchronized."""
    for _ in range(warmup):
        fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def _kernel_time(fn: Callable[[], object], device: str, repeat: int, min_seconds: float = 0.025) -> float:
    """Seconds per call of ``fn`` with the calls issued back to back, as a sync issues its kernels:
    best of ``repeat`` runs of enough calls to fill ``min_seconds``. One synchronized call on an
    otherwise idle GPU would also time its launch and the clocks ramping up (4x a 70 us kernel).
    Each call's result is dropped before the next, as a sync's are: keeping them all (as a list
    comprehension would) times the allocator taking fresh device memory for every call instead."""
    single = _time(fn, device, 1)
    calls = max(1, min(1000, math.ceil(min_seconds / single)))

    def back_to_back() -> None:
        for _ in range(calls):
            fn()

    return _time(back_to_back, device, repeat, warmup=0) / calls


def _master(layers: int, device: str, seed: int, experts: int) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config, Megatron master) with random BF16 values, made one layer at a time on ``device``."""
    config = dict(load_config("Qwen3-30B-A3B"))
    config["num_hidden_layers"] = layers
    config["num_experts"] = experts
    generator = torch.Generator(device=device).manual_seed(seed)
    by_layer: dict[int | None, list[Any]] = {}
    for info in inventory_from_config(config):
        by_layer.setdefault(info.layer, []).append(info)
    master: dict[str, torch.Tensor] = {}
    for infos in by_layer.values():
        tensors = {
            i.name: (torch.randn(i.shape, generator=generator, device=device) * 0.02).to(torch.bfloat16) for i in infos
        }
        master.update(hf_to_megatron(tensors, "qwen3_moe", config))
        del tensors
    return config, master


class Table:
    def __init__(self, roofline: float) -> None:
        self.roofline = roofline
        self.rows: list[dict[str, Any]] = []

    def add(self, what: str, seconds: float, in_bytes: float, moved: float | None = None, note: str = "") -> None:
        row = {"what": what, "seconds": seconds, "gbps": in_bytes / seconds / GB, "note": note}
        if moved is not None and self.roofline:
            row["roofline_pct"] = 100 * (moved / seconds) / self.roofline
        self.rows.append(row)
        pct = f"{row['roofline_pct']:6.1f}%" if "roofline_pct" in row else "      -"
        print(f"{what:<62} {row['gbps']:10.1f} GB/s {seconds * 1e3:10.2f} ms {pct}  {note}", flush=True)


def _copy_bandwidth(device: str) -> float:
    """Device copy bytes (read + write) per second on a 2 GB tensor."""
    x = torch.empty(COPY_ELEMENTS[device.startswith("cuda")], dtype=torch.bfloat16, device=device).fill_(1)
    y = torch.empty_like(x)
    seconds = _time(lambda: y.copy_(x), device, 5, warmup=2)
    return 2 * x.numel() * x.element_size() / seconds


def _weight_rows(table: Table, device: str, repeat: int) -> None:
    x = (torch.randn(14336, 4096, device=device) * 0.02).to(torch.bfloat16)
    n = x.numel()
    nv_moved, mx_moved = n * 2 + n // 2 + n // 16, n * 2 + n + n // 32
    cases: list[tuple[str, Callable[[], object], float]] = [
        ("NVFP4 1x16 quantize 14336x4096 (amax + quantize)", lambda: quantize_nvfp4(x), nv_moved),
        ("NVFP4 1x16, outer amax given (the quantize kernel alone)", lambda: quantize_nvfp4(x, amax=1.0), nv_moved),
        ("NVFP4 16x16 quantize 14336x4096", lambda: quantize_nvfp4(x, tile="16x16"), nv_moved),
        ("NVFP4 row-scaled (per-row amax) 14336x4096", lambda: quantize_nvfp4(x, scope="row"), nv_moved),
        ("NVFP4 te-4over6-mae 1x16 14336x4096", lambda: quantize_nvfp4(x, profile="te-4over6-mae"), nv_moved),
        ("MXFP8 row quantize 14336x4096", lambda: quantize_mxfp8(x), mx_moved),
        ("MXFP8 col quantize 14336x4096", lambda: quantize_mxfp8(x, axis="col"), mx_moved),
    ]
    for what, fn, moved in cases:
        table.add(what, _kernel_time(fn, device, repeat), n * 2, moved)


def _launch_sweep(table: Table, device: str, repeat: int) -> None:
    """The dense NVFP4 / MXFP8 kernels under other launch shapes (columns per step, warps), so the
    defaults can be checked against measurements (the library launches BC=256 with 4 warps)."""
    from fp4convert.formats import _triton_segments as ts

    x = (torch.randn(14336, 4096, device=device) * 0.02).to(torch.bfloat16)
    rows, cols = x.shape
    n = x.numel()
    amax = torch.ones(1, device=device)
    data = torch.empty(rows, cols // 2, dtype=torch.uint8, device=device)
    scale = torch.empty(rows, cols // 16, dtype=torch.uint8, device=device)
    data8 = torch.empty(rows, cols, dtype=torch.uint8, device=device)
    scale8 = torch.empty(rows, cols // 32, dtype=torch.uint8, device=device)
    for bc in (128, 256):
        for steps in (1, 2, 4):

            def nvfp4(bc: int = bc, steps: int = steps) -> None:
                _nvfp4_dense(x, amax, data, scale, bc, steps, reverse=False)

            def mxfp8(bc: int = bc, steps: int = steps) -> None:
                ts._mxfp8_dense_kernel[(rows // 16, ts.spans(cols, bc, steps))](
                    x, cols, rows, data8, scale8, cols, EVEN_R=True, EVEN_C=True, BR=16, BC=bc, CH=steps,
                    HW=ts.hardware_e4m3(x.device), enable_fp_fusion=False,
                )  # fmt: skip

            what = f"BC={bc} column steps={steps}"
            nv_moved, mx_moved = n * 2 + n // 2 + n // 16, n * 2 + n + n // 32
            table.add(f"  sweep: NVFP4 kernel {what}", _kernel_time(nvfp4, device, repeat), n * 2, nv_moved)
            table.add(f"  sweep: MXFP8 kernel {what}", _kernel_time(mxfp8, device, repeat), n * 2, mx_moved)
    # the bf16 MXFP8 kernel (the one quantize_mxfp8 launches) with its E4M3 bytes from integer
    # operations and from the conversion instruction (the library's choice on sm_89+)
    for hw, nb, warps in ((False, 8, 4), (True, 8, 4), (True, 16, 4), (True, 8, 8), (True, 16, 8)):

        def mxfp8_words(hw: bool = hw, nb: int = nb, warps: int = warps) -> None:
            ts._mxfp8_bf16_dense_kernel[(rows // 16, cols // (32 * nb))](
                x, cols, rows, data8, scale8, cols, EVEN_R=True, EVEN_C=True, BR=16, NB=nb, HW=hw,
                enable_fp_fusion=False, num_warps=warps,
            )  # fmt: skip

        what = f"{'the conversion instruction' if hw else 'integer operations'}, NB={nb}, {warps} warps"
        table.add(f"  MXFP8 bf16 kernel, E4M3 from {what}", _kernel_time(mxfp8_words, device, repeat), n * 2,
                  n * 2 + n + n // 32)  # fmt: skip
    # the amax pass then the quantize kernel (what quantize_nvfp4 launches), the second run first to
    # last or last to first (the library's order: its first reads hit what the amax pass left in L2)
    bc = ts.launch_shape(cols, 16)
    for reverse in (False, True):

        def both(reverse: bool = reverse) -> None:
            amax = ts.tensor_amax(x).reshape(1)
            _nvfp4_dense(x, amax, data, scale, bc, ts.nvfp4_steps(rows, cols, bc), reverse=reverse)

        what = "last to first" if reverse else "first to last"
        table.add(f"  amax pass + NVFP4 kernel, quantize {what}", _kernel_time(both, device, repeat), n * 2)


def _nvfp4_dense(
    x: torch.Tensor, amax: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, bc: int, steps: int, *, reverse: bool
) -> None:
    """One launch of the dense NVFP4 kernel (te profile, 1x16) on ``x`` under the given launch shape."""
    from fp4convert.formats import _triton_segments as ts

    rows, cols = x.shape
    ts._nvfp4_dense_kernel[(rows // 16, ts.spans(cols, bc, steps))](
        x, cols, rows, amax, data, scale, cols, rows, PROFILE=0, GMAX=2688.0, TILE16=False, EVEN_R=True,
        EVEN_C=True, BR=16, BC=bc, CH=steps, REVERSE=reverse, HW=ts.hardware_e4m3(x.device), enable_fp_fusion=False,
        **_words(ts, x),
    )  # fmt: skip


def _words(ts: object, x: torch.Tensor) -> dict[str, bool]:
    """The dense kernel's ``WORDS`` argument where the revision under test has it (an A/B against
    an older tree runs this script with that tree's package)."""
    has = "WORDS" in ts._nvfp4_dense_kernel.arg_names  # type: ignore[attr-defined]
    return {"WORDS": ts._bf16_words(x)} if has else {}  # type: ignore[attr-defined]


def _device_memory(device: str) -> int:
    """Bytes allocated on the device now, the peak counter reset (0 on the CPU)."""
    if not device.startswith("cuda"):
        return 0
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def _own_bytes(update: list[tuple[str, torch.Tensor]], master: dict[str, torch.Tensor]) -> int:
    """Bytes of the outputs that are not the master's own tensors (what the exporter allocated)."""
    held = {t.untyped_storage().data_ptr() for t in master.values()}
    return sum(t.numel() * t.element_size() for _, t in update if t.untyped_storage().data_ptr() not in held)


def _stacked_seconds(experts: list[torch.Tensor], device: str, repeat: int) -> float:
    stacked = torch.cat(experts)
    return _kernel_time(lambda: quantize_nvfp4(stacked), device, repeat)


def _kernel_rows(table: Table, device: str, repeat: int, master: dict[str, torch.Tensor]) -> dict[str, float]:
    out: dict[str, float] = {}
    _weight_rows(table, device, repeat)
    # one layer's 128 expert gate projections (the gate rows of each linear_fc1, views of the
    # learner's tensors: 128 x 768 x 2048 = the 98304x2048): stacked into one matrix, one
    # call each, and one grouped launch reading the 128 separate tensors in place
    count = sum(1 for n in master if n.startswith("decoder.layers.0.mlp.experts.linear_fc1."))
    fc1 = [master[f"decoder.layers.0.mlp.experts.linear_fc1.weight{e}"] for e in range(count)]
    experts = [w[: w.shape[0] // 2] for w in fc1]
    n = sum(w.numel() for w in experts)
    moved = n * 2 + n // 2 + n // 16
    rows, cols = n // experts[0].shape[1], experts[0].shape[1]
    seconds = _stacked_seconds(experts, device, repeat)
    table.add(f"NVFP4 quantize {rows}x{cols} (a layer's {count} expert gate_proj stacked)", seconds, n * 2, moved)
    out["stacked"] = n * 2 / seconds / GB
    seconds = _kernel_time(lambda: [quantize_nvfp4(w) for w in experts], device, max(1, repeat // 2))
    table.add(f"NVFP4 the same {count} experts, one call each", seconds, n * 2, moved)
    out["one_call_each"] = n * 2 / seconds / GB
    layout = SegmentLayout.of([w.shape[0] for w in experts], cols=cols)
    sources = Sources(layout).bind(experts)
    data = torch.empty(layout.total_rows, layout.cols // 2, dtype=torch.uint8, device=device)
    scale = torch.empty(layout.total_rows, layout.cols // 16, dtype=torch.uint8, device=device)

    def grouped() -> None:
        amax = unit_amax(sources)
        nvfp4_segments(sources, amax, "te", tile="1x16", data=data, scale=scale)

    seconds = _kernel_time(grouped, device, repeat)
    table.add(f"NVFP4 the same {count} experts, one grouped launch (in place)", seconds, n * 2, moved)
    out["grouped"] = n * 2 / seconds / GB
    # export's own grouping: a layer's whole linear_fc1 (gate + up) of every expert, one launch
    n1 = sum(w.numel() for w in fc1)
    layout1 = SegmentLayout.of([w.shape[0] for w in fc1], cols=cols)
    sources1 = Sources(layout1).bind(fc1)
    data1 = torch.empty(layout1.total_rows, cols // 2, dtype=torch.uint8, device=device)
    scale1 = torch.empty(layout1.total_rows, cols // 16, dtype=torch.uint8, device=device)

    def grouped_fc1() -> None:
        nvfp4_segments(sources1, unit_amax(sources1), "te", tile="1x16", data=data1, scale=scale1)

    seconds = _kernel_time(grouped_fc1, device, repeat)
    table.add(f"NVFP4 {layout1.total_rows}x{cols} ({count} expert linear_fc1, one grouped launch)", seconds, n1 * 2,
              n1 * 2 + n1 // 2 + n1 // 16)  # fmt: skip
    return out


def _byte_check(exported: dict[str, torch.Tensor], master: dict[str, torch.Tensor], plan: Any, layers: int) -> int:
    """Sampled exported tensors against the converter's arithmetic on the CPU; returns tensors checked."""
    checked = 0
    for layer in sorted({0, layers - 1}):
        last = plan.num_experts - 1
        for e in sorted({0, last}):
            fc1 = master[f"decoder.layers.{layer}.mlp.experts.linear_fc1.weight{e}"].cpu()
            fc2 = master[f"decoder.layers.{layer}.mlp.experts.linear_fc2.weight{e}"].cpu()
            head = f"model.layers.{layer}.mlp.experts.{e}"
            gate, up = fc1.chunk(2)
            groups = [
                ([f"{head}.gate_proj.weight", f"{head}.up_proj.weight"], [gate, up]),
                ([f"{head}.down_proj.weight"], [fc2]),
            ]
            for names, values in groups:
                items = [plan.item(n) for n in names]
                for name, want in encode_group(plan, items, values):
                    got = exported[name].cpu()
                    same = got.shape == want.shape and torch.equal(
                        got.contiguous().reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8)
                    )
                    if not same:
                        raise RuntimeError(f"byte check failed: {name} differs from the CPU reference")
                    checked += 1
        norm = f"model.layers.{layer}.input_layernorm.weight"
        ln = master[f"decoder.layers.{layer}.self_attention.linear_qkv.layer_norm_weight"].cpu()
        if not torch.equal(exported[norm].cpu().view(torch.uint8), ln.view(torch.uint8)):
            raise RuntimeError(f"byte check failed: {norm}")
        checked += 1
    return checked


def _validate_rows(
    table: Table,
    master: dict[str, torch.Tensor],
    kwargs: dict[str, Any],
    plan: Any,
    layers: int,
    repeat: int,
) -> None:
    device = str(next(iter(master.values())).device)
    master_bytes = sum(t.numel() * t.element_size() for t in master.values())
    exported = dict(export_hf(master.items(), **kwargs))
    started = time.perf_counter()
    report = validate_export(exported, master, **kwargs)
    _sync(device)
    first = time.perf_counter() - started
    if not report.ok:
        raise RuntimeError(f"validation failed: {report.summary()}")
    table.add("validate_export, first call", first, master_bytes, None)
    seconds = _time(lambda: validate_export(exported, master, **kwargs), device, repeat)
    table.add("validate_export, steady state", seconds, master_bytes, None, f"first = {first / seconds:.1f}x steady")
    if device.startswith("cuda"):  # the same check issued kernel by kernel, as before CUDA-graph replays
        eager = ExportValidator(contract=kwargs["contract"], config=kwargs["config"], dialect=kwargs["dialect"],
                                cuda_graphs=False)  # fmt: skip
        launched = _time(lambda: eager(exported, master), device, repeat)
        table.add("validate, steady state without CUDA-graph replay", launched, master_bytes, None,
                  f"{launched / seconds:.2f}x the replayed steady state")  # fmt: skip
        del eager
    built, fresh, report = _new_validator(kwargs, exported, master, device, prepare=False)
    note = f"{(built + fresh) / seconds:.1f}x steady: construction (plan) {built:.2f} s + first call {fresh:.2f} s"
    table.add("validate, new validator: construction + first call (plan)", built + fresh, master_bytes, None, note)
    # each way a validator is made: the median first call of FIRST_CALLS new ones (the first above included)
    for label, told, prepare, made in (
        ("a constructed ExportValidator", False, False, "construction"),
        ("a validator told its device", True, False, "construction"),
        ("a validator prepared with the master", False, True, "construction + prepare"),
    ):
        built_s, first_s = ([built], [fresh]) if not (told or prepare) else ([], [])
        while len(first_s) < FIRST_CALLS:
            built, fresh, report = _new_validator(kwargs, exported, master, device, prepare=prepare, told=told)
            built_s.append(built)
            first_s.append(fresh)
        fresh, built = statistics.median(first_s), statistics.median(built_s)
        note = f"{fresh / seconds:.1f}x steady (goal <= 3x); {_spread(first_s)}; {made} {built:.2f} s"
        table.add(f"validate, first call of {label}", fresh, master_bytes, None, note)
    checked = _byte_check(exported, master, plan, layers)
    print(f"bytes: {checked} sampled exported tensors equal the CPU reference; validate_export: {report.summary()}")


def _new_validator(
    kwargs: dict[str, Any],
    exported: dict[str, torch.Tensor],
    master: dict[str, torch.Tensor],
    device: str,
    *,
    prepare: bool,
    told: bool = False,
) -> tuple[float, float, Any]:
    """Seconds to construct a validator of a config not seen before (``told`` its device, and
    ``prepare`` it with the master), seconds of its first call, and that call's report (which must pass)."""
    config = {**kwargs["config"], "bench_nonce": time.time_ns()}  # no cached plan
    started = time.perf_counter()
    where = {"device": device} if told else {}
    validator = ExportValidator(contract=kwargs["contract"], config=config, dialect=kwargs["dialect"], **where)
    if prepare:
        validator.prepare(master)
    built = time.perf_counter() - started
    started = time.perf_counter()
    report = validator(exported, master)
    _sync(device)
    fresh = time.perf_counter() - started
    if not report.ok:
        raise RuntimeError(f"validation failed: {report.summary()}")
    return built, fresh, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: 48 on cuda, 1 on cpu)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--contract", default="nvfp4-experts-per-token")
    parser.add_argument("--dialect", default="modelopt")
    parser.add_argument("--experts", type=int, default=128, help="routed experts per layer (128: Qwen3-30B-A3B)")
    parser.add_argument("--skip-kernels", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    device = args.device
    layers = args.layers or (48 if device.startswith("cuda") else 1)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"{name}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)

    started = time.perf_counter()
    config, master = _master(layers, device, seed=0, experts=args.experts)
    _sync(device)
    master_bytes = sum(t.numel() * t.element_size() for t in master.values())
    print(f"master: {layers} layers, {master_bytes / GB:.2f} GB BF16, {len(master)} tensors "
          f"(built in {time.perf_counter() - started:.1f} s)", flush=True)  # fmt: skip
    roofline = _copy_bandwidth(device)
    table = Table(roofline)
    print(f"{'what':<62} {'throughput':>15} {'time':>13} {'% roof':>7}", flush=True)
    copied = 2 * COPY_ELEMENTS[device.startswith("cuda")]
    table.add(
        "device copy (GB/s of bytes read + written): the roofline", 2 * copied / roofline, 2 * copied, 2 * copied
    )

    kwargs = {"contract": args.contract, "family": "qwen3_moe", "config": config, "dialect": args.dialect}
    plan_started = time.perf_counter()
    plan = export_plan(contract=args.contract, config=config, dialect=args.dialect)
    plan_s = time.perf_counter() - plan_started
    quantized_in = sum(i.info.numel * 2 for i in plan.items.values() if i.quantized)
    out_bytes = sum(i.output_bytes for i in plan.items.values() if i.quantized)
    moved = quantized_in + out_bytes  # BF16 tensors are handed over as they are (no bytes moved)
    steady = _guarded("export", _export_rows, table, master, kwargs, plan_s, moved, args.repeat)
    if device.startswith("cuda"):
        allocated, peak = torch.cuda.memory_allocated() / GB, torch.cuda.max_memory_allocated() / GB
        print(
            f"    device memory: {allocated:.1f} GB allocated, {peak:.1f} GB peak "
            f"(master {master_bytes / GB:.1f} GB, quantized output {out_bytes / GB:.2f} GB per set)",
            flush=True,
        )
    _guarded("validate", _validate_rows, table, master, kwargs, plan, layers, args.repeat)
    kernel = {} if args.skip_kernels else _guarded("kernels", _kernel_rows, table, device, args.repeat, master) or {}
    if device.startswith("cuda") and not args.skip_kernels:
        _guarded("launch sweep", _launch_sweep, table, device, args.repeat)
    if steady and kernel:
        export_rate = quantized_in / steady / GB
        stacked, grouped = kernel["stacked"], kernel["grouped"]
        print(
            f"export_hf steady on the quantized weights: {export_rate:.1f} GB/s = {export_rate / stacked:.2f}x the "
            f"quantize kernel on the same experts stacked ({stacked:.1f} GB/s), {export_rate / grouped:.2f}x the "
            "grouped launch",
            flush=True,
        )
    if not device.startswith("cuda"):
        _guarded("ratio", _interleaved_ratio, master, kwargs, args.repeat)
    print("\nsummary (issue 15's table):")
    for row in table.rows:
        pct = f"{row['roofline_pct']:5.1f}% of roofline" if "roofline_pct" in row else ""
        print(f"  {row['what']:<62} {row['gbps']:9.1f} GB/s {row['seconds'] * 1e3:9.2f} ms  {pct} {row['note']}")
    if args.json:
        print(json.dumps({"device": name, "layers": layers, "master_gb": master_bytes / GB, "rows": table.rows}))
    if FAILED:
        raise SystemExit(f"failed sections: {', '.join(FAILED)}")


def _interleaved_ratio(master: dict[str, torch.Tensor], kwargs: dict[str, Any], repeat: int) -> None:
    """Export of the master against the quantize kernel on the same expert weights (stacked per
    projection: the kernel's best case), timed alternately so a shared machine's load hits both."""
    device = str(next(iter(master.values())).device)
    fc1 = torch.cat([t for n, t in master.items() if ".experts.linear_fc1." in n])
    fc2 = torch.cat([t for n, t in master.items() if ".experts.linear_fc2." in n])
    quantized = (fc1.numel() + fc2.numel()) * 2
    exporter = LiveExporter(contract=kwargs["contract"], config=kwargs["config"], dialect=kwargs["dialect"])
    exporter(master.items())
    best_export = best_kernel = float("inf")
    for _ in range(repeat):
        best_export = min(best_export, _time(lambda: exporter(master.items()), device, 1, warmup=0))
        best_kernel = min(best_kernel, _time(lambda: (quantize_nvfp4(fc1), quantize_nvfp4(fc2)), device, 1, warmup=0))
    print(
        f"export vs the quantize kernel on the same expert weights, alternating, best of {repeat}: export "
        f"{quantized / best_export / GB:.2f} GB/s of quantized weights ({best_export:.2f} s for the whole layer), "
        f"kernel {quantized / best_kernel / GB:.2f} GB/s ({best_kernel:.2f} s): {best_kernel / best_export:.2f}x",
        flush=True,
    )


def _guarded(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run one section; a failure is printed and the next section still runs (one device batch)."""
    try:
        return fn(*args)
    except Exception as error:
        FAILED.append(what)
        print(f"!! {what} failed: {type(error).__name__}: {error}", flush=True)
        traceback.print_exc(limit=4)
        return None


def _gigabyte_buckets(exporter: LiveExporter, master: dict[str, torch.Tensor]) -> list[Any]:
    return list(exporter.buckets(master.items(), max_bytes=1 << 30))


def _export_rows(
    table: Table, master: dict[str, torch.Tensor], kwargs: dict[str, Any], plan_s: float, moved: int, repeat: int
) -> float:
    """export_hf first call and steady state, and the reusable exporter; returns export_hf's steady time."""
    device = str(next(iter(master.values())).device)
    master_bytes = sum(t.numel() * t.element_size() for t in master.values())
    started = time.perf_counter()
    count = len(dict(export_hf(master.items(), **kwargs)))
    _sync(device)
    cold = time.perf_counter() - started
    table.add("export_hf, first call in the process", cold + plan_s, master_bytes, moved,
              f"plan {plan_s:.2f} s + {cold:.2f} s: resolution, buffers, kernel compilation")  # fmt: skip

    def export_once(lazily: bool) -> None:
        update = dict(export_hf(iter(master.items()) if lazily else master.items(), **kwargs))
        assert len(update) == count

    steady = _time(functools.partial(export_once, False), device, repeat)
    table.add(f"export_hf, steady state ({count} tensors, a dict's items)", steady, master_bytes, moved,
              "one whole update: replayed as one CUDA graph on a GPU")  # fmt: skip
    # a first call is necessarily eager: it is put against the eager steady state too
    streamed = _time(functools.partial(export_once, True), device, repeat)
    table.add("export_hf, steady state, from an iterator (streamed)", streamed, master_bytes, moved,
              f"{streamed / steady:.2f}x the whole update's time")  # fmt: skip

    def against(first: float) -> str:
        return f"{first / steady:.1f}x steady, {first / streamed:.1f}x streamed steady"

    # device=None: an exporter not told its device makes its output buffers and their views in
    # its first sync (the default, "auto", makes them at construction on the current CUDA device)
    exporter = LiveExporter(contract=kwargs["contract"], config=kwargs["config"], dialect=kwargs["dialect"],
                            device=None)  # fmt: skip
    started = time.perf_counter()
    assert len(exporter(master.items())) == count
    _sync(device)
    fresh = time.perf_counter() - started
    table.add("export, first call of a new exporter, device=None (plan cached)", fresh, master_bytes, moved,
              against(fresh))  # fmt: skip
    del exporter
    gc.collect()
    # what a new RL job pays once its kernels are in Triton's on-disk cache: the plan built afresh
    # (a config the plan cache has not seen), resolution, layouts, buffers, then the sync itself
    rebuilt = {**kwargs["config"], "bench_nonce": time.time_ns()}
    before = _device_memory(device)
    started = time.perf_counter()
    exporter = LiveExporter(contract=kwargs["contract"], config=rebuilt, dialect=kwargs["dialect"], device=None)
    built = time.perf_counter() - started
    started = time.perf_counter()
    update = exporter(master.items())
    _sync(device)
    first = time.perf_counter() - started
    own = _own_bytes(update, master)
    note = f"{against(built + first)}: construction (plan) {built:.2f} s + first call {first:.2f} s"
    table.add("export, new exporter, device=None: construction + first call", built + first, master_bytes, moved, note)
    table.add("export, first call of a constructed exporter, device=None", first, master_bytes, moved,
              f"{against(first)}: buffers and views made in it")  # fmt: skip
    del update
    gc.collect()
    if device.startswith("cuda"):
        first_peak = torch.cuda.max_memory_allocated() - before
        kept = torch.cuda.memory_allocated() - before
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        exporter(master.items())
        _sync(device)
        gc.collect()
        steady_peak = torch.cuda.max_memory_allocated() - base
        grown = torch.cuda.memory_allocated() - base
        print(f"    device memory of a sync: quantized output {own / GB:.2f} GB; first sync peak extra "
              f"{first_peak / GB:.2f} GB ({first_peak / own:.2f}x the output), kept {kept / GB:.2f} GB; steady sync "
              f"peak extra {steady_peak / GB:.3f} GB, growth after it {grown} bytes", flush=True)  # fmt: skip
    replayed = _time(functools.partial(exporter, master.items()), device, repeat)
    table.add("LiveExporter, steady state (whole update, plan order)", replayed, master_bytes, moved)
    seconds = _time(functools.partial(_gigabyte_buckets, exporter, master), device, repeat)
    table.add("LiveExporter.buckets(max_bytes=1 GiB), steady state", seconds, master_bytes, moved)
    del exporter  # its buffers freed before the next exporter's are made
    gc.collect()
    if device.startswith("cuda"):  # the same issued kernel by kernel, as before CUDA-graph replays
        eager = LiveExporter(contract=kwargs["contract"], config=kwargs["config"], dialect=kwargs["dialect"],
                             cuda_graphs=False)  # fmt: skip
        launched = _time(functools.partial(eager, master.items()), device, repeat)
        table.add("LiveExporter, steady state without CUDA-graph replay", launched, master_bytes, moved,
                  f"{launched / replayed:.2f}x the replayed steady state")  # fmt: skip
        del eager
        gc.collect()
    # as constructed by default (device="auto": the output buffers made at construction on the
    # current CUDA device; on a CPU, the same as device="cpu"), the median of FIRST_CALLS new
    # exporters (one first call varies by up to 1.4x between runs)
    built_s: list[float] = []
    first_s: list[float] = []
    for _ in range(FIRST_CALLS):
        rebuilt_2 = {**kwargs["config"], "bench_nonce": time.time_ns()}
        started = time.perf_counter()
        where = {} if device.startswith("cuda") else {"device": device}
        warm = LiveExporter(contract=kwargs["contract"], config=rebuilt_2, dialect=kwargs["dialect"], **where)
        _sync(device)
        built_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert len(warm(master.items())) == count
        _sync(device)
        first_s.append(time.perf_counter() - started)
        del warm
        gc.collect()
    warm_first = statistics.median(first_s)
    note = f"{against(warm_first)} (goal <= 3x); {_spread(first_s)}; construction {statistics.median(built_s):.2f} s"
    table.add("export, first call of a constructed exporter", warm_first, master_bytes, moved, note)
    return steady


def _spread(seconds: list[float]) -> str:
    """How many first calls a median row took, and their range."""
    return f"median of {len(seconds)}: {min(seconds) * 1e3:.0f}-{max(seconds) * 1e3:.0f} ms"


if __name__ == "__main__":
    main()
