"""LiveExporter: the reusable exporter's outputs (plan order, buckets), its buffers (reused only when
nothing holds them, never overwritten under a caller), every expert spelling, the dtype norms are
sent in, and validate_export on stacked-expert masters."""

from __future__ import annotations

import gc
import warnings
import weakref
from pathlib import Path

import pytest
import torch
from _helpers import CUDA, MXFP8_ALL, NVFP4_EXPERTS, assert_bytes_equal, count_uploads

from fp4convert import export_hf, validate_export
from fp4convert.errors import ConversionError, MappingError
from fp4convert.families import MegatronSpelling, hf_to_megatron
from fp4convert.megatron import groups as groups_module
from fp4convert.megatron import sync as sync_module
from fp4convert.megatron.groups import Run
from fp4convert.megatron.sync import LiveExporter, bucketed
from fp4convert.megatron.validate import ExportValidator

STACKED = ["single_grouped", "legacy_grouped"]
DEEPSEEK_NVFP4 = Path(__file__).parent / "data" / "deepseek-nvfp4-mla-bf16.yaml"


def _exporter(config, **kwargs) -> LiveExporter:
    return LiveExporter(contract=NVFP4_EXPERTS, config=config, **kwargs)


def _as_bytes(pairs) -> dict[str, bytes]:
    return {n: bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist()) for n, t in pairs}


def test_whole_update_in_plan_order_equals_export_hf(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config)
    update = exporter(megatron)
    names = [n for n, _ in update]
    plan_order = [out[0] for item in exporter.items for out in item.outputs]
    assert names == plan_order
    # export_hf takes a collection it is handed whole too, and streams an iterator's groups as they complete
    held = list(export_hf(megatron, contract=NVFP4_EXPERTS, family=None, config=config))
    assert [n for n, _ in held] == plan_order
    assert _as_bytes(held) == _as_bytes(update)
    streamed = dict(export_hf(iter(megatron.items()), contract=NVFP4_EXPERTS, family=None, config=config))
    assert sorted(streamed) == sorted(names) and list(streamed) != plan_order
    for name, tensor in update:
        assert tensor.dtype == streamed[name].dtype, name
        assert_bytes_equal(tensor, streamed[name])


def test_buckets_hold_at_most_max_bytes_in_plan_order(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config)
    whole = [n for n, _ in exporter(megatron)]
    limit = 1 << 14
    buckets = list(exporter.buckets(megatron, max_bytes=limit))
    assert [n for bucket in buckets for n, _ in bucket] == whole
    for bucket in buckets:
        sizes = [t.numel() * t.element_size() for _, t in bucket]
        assert sum(sizes) <= limit or len(bucket) == 1
    pairs = [(str(i), torch.zeros(n, dtype=torch.uint8)) for i, n in enumerate([3, 3, 5, 1, 9])]
    assert [[n for n, _ in b] for b in bucketed(pairs, 6)] == [["0", "1"], ["2", "3"], ["4"]]


def test_buffers_are_reused_only_when_nothing_holds_them(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config)
    name = "model.layers.0.mlp.experts.2.up_proj.weight"
    first = dict(exporter(megatron))
    before = _as_bytes(first.items())
    address = first[name].data_ptr()
    # while the first update is held, the next sync writes elsewhere, and the first keeps its bytes
    changed = {k: (t * 2 if t.is_floating_point() else t) for k, t in megatron.items()}
    second = dict(exporter(changed))
    other = second[name].data_ptr()
    assert other != address
    assert _as_bytes(first.items()) == before
    assert _as_bytes(second.items()) != before
    # dropped: the next sync reuses a set (no allocation growth); a view derived from an output
    # also pins its buffer
    del first, second
    gc.collect()
    third = dict(exporter(megatron))
    assert third[name].data_ptr() in {address, other}
    kept = third[name].view(torch.uint8)[:1]
    del third
    gc.collect()
    fourth = dict(exporter(megatron))
    assert kept.data_ptr() != fourth[name].data_ptr()
    assert len(exporter._sets) <= exporter.output_sets


@pytest.mark.parametrize("suffix", ["weight", "weight_scale", "weight_scale_2"])
def test_one_output_tensor_held_alone_keeps_its_buffers_from_being_reused(suffix, model):
    # only its reference count tells: holding the tensor itself makes no new view of the storage
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config, output_sets=1)
    name = f"model.layers.0.mlp.experts.2.up_proj.{suffix}"
    held = dict(exporter(megatron))[name]
    before = held.clone()
    # other values everywhere: block scales, codes and the global scale all change
    changed = {k: (t.flip(-1) * 3 if t.is_floating_point() else t) for k, t in megatron.items()}
    update = dict(exporter(changed))
    assert update[name].data_ptr() != held.data_ptr() and torch.equal(held, before)
    assert not torch.equal(update[name], before)


def test_steady_state_reuses_the_same_buffers(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config)
    name = "model.layers.0.mlp.experts.0.gate_proj.weight_scale"
    addresses = set()
    for _ in range(3):
        update = dict(exporter(megatron))
        addresses.add(update[name].data_ptr())
        del update
        gc.collect()
    assert len(addresses) == 1


def test_buffers_allocated_at_construction_are_the_first_syncs(model):
    # device=...: the first set of output buffers exists before the first sync, which fills it
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config, device="cpu")
    assert len(exporter._sets) == 1 and len(exporter._sets[0].groups) == len(exporter.groups)
    allocated = {g.data.data_ptr() for g in exporter._sets[0].groups.values()}
    update = exporter(megatron)
    quantized = [t for n, t in update if n.endswith("gate_proj.weight") and t.dtype == torch.uint8]
    assert quantized and all(any(t.untyped_storage().data_ptr() == a for a in allocated) for t in quantized)
    reference = dict(_exporter(config)(megatron))
    for name, tensor in update:
        assert_bytes_equal(tensor, reference[name])


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_an_exporter_told_its_device_makes_its_tables_at_construction(device, model, monkeypatch):
    # LiveExporter(device=...): each group's segment tables (on a GPU) and its members' units are
    # made by the constructor; the first sync uploads only the master segments' addresses (on a GPU)
    hf, config = model("qwen3_moe")
    megatron = {n: t.to(device) for n, t in hf_to_megatron(hf, "qwen3_moe", config).items()}
    uploads = count_uploads(monkeypatch)
    told = _exporter(config, device=device)
    assert "_units_on" in uploads and ("tables" in uploads) == (device == "cuda")
    uploads.clear()
    want = _as_bytes(told(megatron))
    assert set(uploads) == ({"device_tables"} if device == "cuda" else set())
    uploads.clear()
    untold = _exporter(config, device=None)
    assert not uploads
    assert _as_bytes(untold(megatron)) == want
    assert "_units_on" in uploads


def test_an_exporter_not_told_its_device_waits_for_its_first_sync_without_cuda(model, monkeypatch):
    # device="auto" (the default) names the current CUDA device; without one, nothing is made yet
    _, config = model("qwen3_moe")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    uploads = count_uploads(monkeypatch)
    exporter = _exporter(config)
    assert exporter._sets == [] and not uploads


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_exporter_not_told_its_device_makes_its_buffers_on_the_current_cuda_device(model):
    _, config = model("qwen3_moe")
    exporter = _exporter(config)
    current = torch.device("cuda", torch.cuda.current_device())
    assert len(exporter._sets) == 1 and {g.data.device for g in exporter._sets[0].groups.values()} == {current}


@pytest.mark.parametrize("made_for", ["meta", CUDA])
def test_buffers_made_for_another_device_than_the_first_syncs_are_dropped(made_for, model):
    # the first sync arrives on the CPU: the set the constructor made elsewhere (a GPU, or here a
    # stand-in) is emptied before its first group, so its buffers are freed, not kept beside new ones
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config, device="cpu" if made_for == "meta" else made_for)
    (made,) = exporter._sets
    if made_for == "meta":
        made.made_for = torch.device("meta")
    constructed = [weakref.ref(g.data) for g in made.groups.values()]
    update = exporter(megatron)
    gc.collect()
    assert made.made_for is None and not any(ref() is not None for ref in constructed)
    assert {t.device.type for _, t in update} == {"cpu"}
    assert _as_bytes(update) == _as_bytes(_exporter(config, device=None)(megatron))


@pytest.mark.parametrize("make", [LiveExporter, ExportValidator])
@pytest.mark.parametrize("device", ["gpu", "cuda:64"])
def test_a_device_that_is_not_here_is_refused_at_construction(make, device, model):
    _, config = model("qwen3_moe")
    with pytest.raises(ConversionError, match=r"is not cpu, cuda or cuda:N|this machine has"):
        make(contract=NVFP4_EXPERTS, config=config, device=device)


def _merged(monkeypatch) -> list[bool]:
    """Runs on (FP4CONVERT_MERGE_RUNS) for exporters made from here on; every launch set of a
    group or a run recorded, True for a run."""
    monkeypatch.setattr(sync_module, "_MERGE_RUNS", True)
    launched: list[bool] = []

    def recorded(plan, unit, tensors, out, real=groups_module.run_bound):
        launched.append(isinstance(unit, Run))
        return real(plan, unit, tensors, out)

    monkeypatch.setattr(sync_module, "run_bound", recorded)  # a run's
    monkeypatch.setattr(groups_module, "run_bound", recorded)  # a group's (run_group)
    return launched


@pytest.mark.parametrize(("key", "contract", "dialect", "layout"), [
    ("qwen3_moe", NVFP4_EXPERTS, "modelopt", "grouped"),
    ("qwen3_moe", NVFP4_EXPERTS, "compressed-tensors", "sequential"),
    ("qwen3_moe", NVFP4_EXPERTS, "modelopt", "single_grouped"),
    ("qwen3_moe", MXFP8_ALL, "sglang-mxfp8", "grouped"),
    ("deepseek_v3", DEEPSEEK_NVFP4, "compressed-tensors", "grouped"),
])  # fmt: skip
def test_runs_quantize_a_whole_update_as_its_groups_would(key, contract, dialect, layout, model, monkeypatch):
    # a whole update's groups of one format, tile and width quantized by one set of launches (a run):
    # the bytes of every output equal each group's own launches', sync after sync, into one output set
    hf, config = model(key)
    megatron = hf_to_megatron(hf, key, config, expert_layout=layout)
    monkeypatch.setattr(sync_module, "_MERGE_RUNS", False)  # each group's own launches
    want = _as_bytes(LiveExporter(contract=contract, config=config, dialect=dialect)(megatron))
    launched = _merged(monkeypatch)
    exporter = LiveExporter(contract=contract, config=config, dialect=dialect)
    assert exporter._runs and all(len(run.members) > 1 for run in exporter._runs)
    for _ in range(3):  # eager, then the CPU's later syncs (no graphs there)
        launched.clear()
        got = exporter(megatron)
        assert _as_bytes(got) == want
        assert launched.count(True) == len(exporter._runs)
        assert launched.count(False) == len(exporter.groups) - len(exporter._in_run)  # the groups of no run
        del got
        gc.collect()
    assert len(exporter._sets) == 1  # the update dropped each time: its set reused
    launched.clear()
    assert _as_bytes(exporter.stream(iter(megatron.items()))) == want  # streamed: group by group
    assert launched and not any(launched)


def test_a_run_made_at_construction_is_the_first_syncs_and_a_run_not_read_in_place_runs_its_groups(model, monkeypatch):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    launched = _merged(monkeypatch)
    exporter = _exporter(config, device="cpu")
    made = exporter._sets[0].runs
    assert set(made) == set(range(len(exporter._runs)))
    storages = {buffers.data.untyped_storage().data_ptr() for buffers in made.values()}
    update = exporter(megatron)
    quantized = [t for n, t in update if n.endswith("down_proj.weight") and t.dtype == torch.uint8]
    assert quantized and all(t.untyped_storage().data_ptr() in storages for t in quantized)
    want = _as_bytes(update)
    del update, quantized  # the set free again: the next sync reuses it
    # one layer's experts in FP32, the others in BF16: a run's tensors of two dtypes cannot be read
    # by one launch, so its groups run alone, each into its rows of the run's matrices
    mixed = {n: t.float() if ".layers.0.mlp.experts" in n else t for n, t in megatron.items()}
    monkeypatch.setattr(sync_module, "_MERGE_RUNS", False)
    reference = _as_bytes(_exporter(config)(mixed))
    launched.clear()
    update = exporter(mixed)
    assert _as_bytes(update) == reference == want  # FP32 holds each BF16 value exactly
    assert launched.count(True) == len(exporter._runs) and launched.count(False) > len(exporter.groups) - len(
        exporter._in_run
    )
    quantized = [t for n, t in update if n.endswith("down_proj.weight") and t.dtype == torch.uint8]
    assert quantized and all(t.untyped_storage().data_ptr() in storages for t in quantized)


def _own_bytes(update, master) -> int:
    """Bytes of the outputs that are not the master's own tensors (what the exporter allocated)."""
    held = {t.untyped_storage().data_ptr() for t in master.values()}
    return sum(t.numel() * t.element_size() for _, t in update if t.untyped_storage().data_ptr() not in held)


def _profiled_sync(exporter, master) -> tuple[list[tuple[str, int]], int, int]:
    """One sync whose update is dropped at once, under the profiler's memory tracking: the
    allocating ops in order with their bytes, the net bytes the sync left allocated, and the peak
    of the bytes it had allocated at any point (events in time order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        update = exporter(master)
        del update
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    ops = [(e.name, e.self_cpu_memory_usage) for e in events if e.name != "[memory]" and e.self_cpu_memory_usage]
    deltas = [e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage for e in events]
    running = peak = 0
    for delta in deltas:
        running += delta
        peak = max(peak, running)
    return ops, running, peak


@pytest.mark.parametrize(("layout", "dialect"), [("grouped", "modelopt"), ("single_grouped", "compressed-tensors")])
def test_no_allocation_grows_across_syncs(layout, dialect, model):
    """Sync 1 keeps one set of output buffers (about the quantized output's size); every later sync
    allocates exactly what sync 2 allocates (the same ops, the same bytes), frees all of it, and
    never holds more than a fraction of one output at once."""
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config, expert_layout=layout)
    exporter = _exporter(config, dialect=dialect)
    own = _own_bytes(exporter(megatron), megatron)
    gc.collect()
    fresh = _exporter(config, dialect=dialect)
    _, kept, _ = _profiled_sync(fresh, megatron)
    assert own <= kept <= 1.15 * own, (kept, own)  # the output set, its views and the segment tables
    steady = [_profiled_sync(fresh, megatron) for _ in range(5)]
    ops, net, peak = steady[0]
    assert ops and net == 0
    assert peak < own / 2, (peak, own)  # a second output set would be >= own
    for later in steady[1:]:
        assert later == steady[0]
    assert len(fresh._sets) == 1


def test_a_sync_runs_with_the_garbage_collector_paused(model):
    """No collection starts inside a whole-update sync or a validation, though each allocates far
    more objects than the threshold; the collector's state is restored afterwards (on, or off if it
    was off). A streamed export runs with the collector as the caller has it."""
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    exporter = _exporter(config)
    update = dict(exporter(megatron))
    validator = ExportValidator(contract=NVFP4_EXPERTS, config=config)
    validator(update, megatron)
    started: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(50)
    gc.callbacks.append(count)
    try:
        gc.collect()
        before = len(started)
        pairs = exporter(megatron)
        after_export = len(started)
        gc.collect()
        before_validate = len(started)
        report = validator(update, megatron)
        after_validate = len(started)
        gc.collect()
        before_stream = len(started)
        streamed = list(exporter.stream(megatron))
        after_stream = len(started)
        gc.disable()
        exporter(megatron)
        still_off = not gc.isenabled()
    finally:
        gc.enable()
        gc.callbacks.remove(count)
        gc.set_threshold(*threshold)
    # at most the one collection the allocations made meanwhile start once the collector is back on
    assert after_export - before <= 1 and after_validate - before_validate <= 1, (before, after_export)
    assert after_stream - before_stream > 2, (before_stream, after_stream)  # the same work, collector on
    assert report.ok and still_off and len(pairs) == len(streamed)


@pytest.mark.parametrize("layout", STACKED)
def test_stacked_expert_masters_export_and_validate(layout, model):
    hf, config = model("qwen3_moe")
    grouped = hf_to_megatron(hf, "qwen3_moe", config)
    stacked = hf_to_megatron(hf, "qwen3_moe", config, expert_layout=layout)
    kwargs = {"contract": NVFP4_EXPERTS, "family": None, "config": config}
    expected = dict(export_hf(grouped, **kwargs))
    got = dict(export_hf(stacked, **kwargs))
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert_bytes_equal(got[name], tensor)
    assert validate_export(got, stacked, **kwargs).ok
    # a failure against a stacked master is diagnosed too (the diagnosis reads the unpacked experts)
    broken = dict(got)
    name = "model.layers.0.mlp.experts.3.down_proj.weight"
    broken[name] = broken[name].clone()
    broken[name][0, 0] ^= 0x11
    report = validate_export(broken, stacked, **kwargs)
    assert not report.ok and any(f.tensor == name and f.check == "bytes" for f in report.findings)


@pytest.mark.parametrize("layout", ["grouped", *STACKED])
def test_a_whole_update_read_in_bulk_equals_the_walk_tensor_by_tensor(layout, model):
    # a whole update of tensors seen (or predicted) before is read in C-level passes (_known); one
    # the walk must check (another dtype, a meta tensor, a piece given twice) takes the walk
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config, expert_layout=layout)
    exporter = _exporter(config)
    want = _as_bytes(_exporter(config).stream(iter(megatron.items())))
    # the plan's own layout is predicted at construction; a stacked one is first seen by the walk
    assert (exporter._known(list(megatron.items())) is not None) == (layout == "grouped")
    assert _as_bytes(exporter(megatron)) == want
    assert exporter._known(list(megatron.items())) is not None
    assert _as_bytes(exporter(megatron)) == want
    embedding = next(n for n in megatron if "embedding" in n)
    widened = {**megatron, embedding: megatron[embedding].float()}
    assert exporter._known(list(widened.items())) is None  # predicted in BF16: checked by the walk
    assert _as_bytes(exporter(widened)) == _as_bytes(_exporter(config).stream(iter(widened.items())))
    assert exporter._known(list(widened.items())) is not None  # checked once, then read in bulk
    twice = [*megatron.items(), (embedding, megatron[embedding])]
    with pytest.raises(MappingError, match="produced twice"):
        exporter(twice)
    ghost = {**megatron, embedding: torch.empty(megatron[embedding].shape, device="meta")}
    with pytest.raises(MappingError, match="meta device"):
        exporter(ghost)


def test_a_parameter_moved_onto_strided_memory_between_syncs_is_still_exported_and_validated_right(model):
    # ``param.data = ...`` keeps the tensor object a sync bound; rows no longer contiguous must not
    # be read in place as if they were (the CPU kernels and the address tables assume they are)
    hf, config = model("qwen3_moe")
    megatron = {n: t.clone() for n, t in hf_to_megatron(hf, "qwen3_moe", config).items()}
    want = _as_bytes(_exporter(config)(megatron))
    exporter, validator = _exporter(config), ExportValidator(contract=NVFP4_EXPERTS, config=config)
    assert _as_bytes(exporter(megatron)) == want  # every group bound to the parameters themselves
    assert validator(dict(exporter(megatron)), megatron).ok
    name = next(n for n in megatron if n.endswith("linear_fc1.weight0"))
    param = megatron[name]
    wide = torch.zeros(param.shape[0], 2 * param.shape[1], dtype=param.dtype)
    wide[:, ::2] = param
    param.data = wide[:, ::2]
    update = exporter(megatron)
    assert _as_bytes(update) == want
    assert validator(dict(update), megatron).ok


def test_norms_the_learner_holds_in_float32_are_sent_in_the_checkpoint_dtype(model, converted, read_tensors):
    """Megatron's local spec keeps RMSNorm weights in float32 inside a BF16 model; the converted
    checkpoint (and the sampler) hold them in BF16: export sends BF16, the bytes convert writes."""
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config, spelling=MegatronSpelling.parse("local"))
    norms = [n for n in megatron if n.endswith("layernorm.weight") or n.endswith("final_layernorm.weight")]
    assert norms
    learner = {n: (t.float() if n in norms else t) for n, t in megatron.items()}
    kwargs = {"contract": NVFP4_EXPERTS, "family": None, "config": config}
    exported = dict(export_hf(learner, **kwargs))
    on_disk = read_tensors(converted("qwen3_moe", "modelopt", NVFP4_EXPERTS))
    for name in (
        "model.layers.0.input_layernorm.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.norm.weight",
    ):
        assert exported[name].dtype == torch.bfloat16 == on_disk[name].dtype
        assert_bytes_equal(exported[name], on_disk[name])
    assert validate_export(exported, learner, **kwargs).ok
    # an exporter that sends the float32 norm is told the dtype the update must have
    faulty = dict(exported)
    faulty["model.norm.weight"] = learner[next(n for n in norms if "final" in n)]
    report = validate_export(faulty, learner, **kwargs)
    assert [(f.tensor, f.check) for f in report.findings] == [("model.norm.weight", "dtype")]


def test_a_partial_update_exports_its_complete_units(model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    some = {n: t for n, t in megatron.items() if n.endswith("linear_fc1.weight1") or "embedding" in n}
    got = dict(export_hf(some, contract=NVFP4_EXPERTS, family=None, config=config))
    full = dict(export_hf(megatron, contract=NVFP4_EXPERTS, family=None, config=config))
    assert "model.layers.0.mlp.experts.1.gate_proj.weight" in got and "model.embed_tokens.weight" in got
    for name, tensor in got.items():
        assert_bytes_equal(tensor, full[name])


@pytest.fixture
def recorded_graphs(monkeypatch, captures):
    """Recorded captures (conftest's ``captures``) of syncs on the CPU, as if it were a GPU."""
    monkeypatch.setattr(sync_module, "_replays_on", lambda device: True)
    return captures.made


def test_replayed_syncs_hand_out_the_eager_syncs_outputs(model, recorded_graphs):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    eager = _exporter(config, cuda_graphs=False)
    want = _as_bytes(eager(megatron))
    exporter = _exporter(config)
    for sync in range(4):  # eager, captured, replayed, replayed
        update = exporter(megatron)
        assert [n for n, _ in update] == list(want) and _as_bytes(update) == want
        assert len(recorded_graphs) == min(sync, 1)
        del update  # handed on: the set is free for the next sync
    assert recorded_graphs[0].replays == 3
    update = exporter(megatron)
    # the same views of the set as an eager sync, fresh pairs; a parameter sent as itself is this call's
    again = exporter._whole(list(megatron.items()), exporter._sets[0])
    assert all(a is b for (_, a), (_, b) in zip(update, again, strict=True) if a.data_ptr() not in {
        t.data_ptr() for t in megatron.values()})  # fmt: skip
    norm = dict(update)["model.norm.weight"]
    assert norm.data_ptr() == megatron["decoder.final_layernorm.weight"].data_ptr()
    del update, again, norm
    # a caller that keeps one update while the next sync runs: two sets, each captured, alternating
    held = exporter(megatron)
    for _ in range(4):
        nxt = exporter(megatron)
        assert _as_bytes(nxt) == want and _as_bytes(held) == want
        held = nxt
        del nxt
    assert len(recorded_graphs) == 2 and len(exporter._sets) == 2
    # parameters from an iterator are consumed lazily (it may gather each as it goes): never captured
    del held
    for _ in range(3):
        assert _as_bytes(exporter(iter(list(megatron.items())))) == want
    assert len(recorded_graphs) == 2
    # a partial update is never captured
    part = {n: t for n, t in megatron.items() if "layers.1." not in n}
    for _ in range(3):
        assert len(exporter(part)) < len(want)
    assert len(recorded_graphs) == 2


def test_export_hf_replays_the_parameters_it_is_handed_whole(model, recorded_graphs, monkeypatch):
    from fp4convert.megatron import export as export_module

    monkeypatch.setattr(export_module, "_EXPORTERS", type(export_module._EXPORTERS)())  # none kept from other tests
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config)
    want = _as_bytes(_exporter(config, cuda_graphs=False)(megatron))
    where = {"contract": NVFP4_EXPERTS, "family": None, "config": config}
    for sync in range(4):  # eager, captured, replayed, replayed
        assert _as_bytes(export_hf(megatron.items(), **where)) == want
        assert len(recorded_graphs) == min(sync, 1)
    assert recorded_graphs[0].replays == 3
    for _ in range(2):  # an iterator: streamed, eagerly
        assert _as_bytes(export_hf(iter(megatron.items()), **where)) == want
    assert len(recorded_graphs) == 1 and recorded_graphs[0].replays == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", ["grouped", "sequential", *STACKED])
@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_cuda_live_exporter_equals_the_cpu_export(layout, dialect, model):
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config, expert_layout=layout)
    cpu = dict(LiveExporter(contract=NVFP4_EXPERTS, config=config, dialect=dialect)(megatron))
    exporter = LiveExporter(contract=NVFP4_EXPERTS, config=config, dialect=dialect)
    on_gpu = {n: t.cuda() for n, t in megatron.items()}
    for _ in range(2):  # the second sync reuses what the first built
        gpu = dict(exporter(on_gpu))
        assert sorted(gpu) == sorted(cpu)
        for name, tensor in cpu.items():
            assert gpu[name].is_cuda and gpu[name].dtype == tensor.dtype, name
            assert_bytes_equal(gpu[name], tensor)
        assert validate_export(gpu, on_gpu, contract=NVFP4_EXPERTS, family=None, config=config, dialect=dialect).ok
        del gpu


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("key", "contract", "dialect"), [
    ("qwen3_moe", NVFP4_EXPERTS, "modelopt"), ("qwen3_moe", MXFP8_ALL, "sglang-mxfp8"),
    ("deepseek_v3", DEEPSEEK_NVFP4, "compressed-tensors"),
])  # fmt: skip
@pytest.mark.parametrize("graphs", [True, False])
def test_cuda_device_memory_does_not_grow_across_syncs(key, contract, dialect, graphs, model):
    """torch.cuda.memory_allocated after every steady sync (update dropped) is what it was after
    the first; a steady sync allocates under half an output set at its peak and never synchronises
    with the host; the first sync keeps about one output set; bytes equal the CPU export every time.
    With CUDA graphs the second sync is captured (steady syncs are replays of it)."""
    hf, config = model(key)
    megatron = hf_to_megatron(hf, key, config)
    cpu = dict(LiveExporter(contract=contract, config=config, dialect=dialect)(megatron))
    on_gpu = {n: t.cuda() for n, t in megatron.items()}
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()  # the constructor makes the first output set (device="auto")
    exporter = LiveExporter(contract=contract, config=config, dialect=dialect, cuda_graphs=graphs)
    update = exporter(on_gpu)
    own = _own_bytes(update, on_gpu)
    for name, tensor in update:
        assert_bytes_equal(tensor, cpu[name])
    del update
    gc.collect()
    torch.cuda.synchronize()
    after_first = torch.cuda.memory_allocated()
    # the output set, plus what the caching allocator rounds each small buffer up to (512 B blocks:
    # a group's three output matrices, its segment and address tables) and the split copies
    slack = 8192 * len(exporter.groups) + 512 * len(cpu) + (1 << 16)
    assert own <= after_first - before <= own + slack, (after_first - before, own, slack)
    update = dict(exporter(on_gpu))  # with graphs: captured, then replayed once
    for name, tensor in cpu.items():
        assert_bytes_equal(update[name], tensor)
    del update
    gc.collect()
    torch.cuda.synchronize()
    assert exporter._replay.graphs == int(graphs)
    assert torch.cuda.memory_allocated() - after_first <= slack  # a graph keeps no output of its own
    after_first = torch.cuda.memory_allocated()
    for _ in range(3):
        torch.cuda.reset_peak_memory_stats()
        # no host synchronisation anywhere in a steady sync (amaxes and global scales stay on the device)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                update = dict(exporter(on_gpu))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert not [w for w in caught if "synchroniz" in str(w.message)], [str(w.message) for w in caught][:3]
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - after_first
        for name, tensor in cpu.items():
            assert_bytes_equal(update[name], tensor)
        del update
        gc.collect()
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == after_first
        assert peak < max(own / 2, 1 << 16), (peak, own)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dialect", ["modelopt", "compressed-tensors"])
def test_cuda_graph_replays_equal_eager_syncs_as_the_learner_steps(dialect, model):
    hf, config = model("qwen3_moe")
    on_gpu = {n: t.cuda() for n, t in hf_to_megatron(hf, "qwen3_moe", config).items()}
    exporter = _exporter(config, dialect=dialect)
    eager = _exporter(config, dialect=dialect, cuda_graphs=False)
    fc2 = next(n for n in on_gpu if ".mlp.experts.linear_fc2.weight" in n)
    norm = "decoder.final_layernorm.weight"
    before = None
    for sync in range(6):  # eager, captured, then replays; from the fourth the learner steps in place
        if sync >= 3:
            on_gpu[fc2].mul_(1.25)
            on_gpu[norm].add_(1.0)
        got, want = exporter(on_gpu), eager(on_gpu)
        assert [n for n, _ in got] == [n for n, _ in want]
        for (_, a), (_, b) in zip(got, want, strict=True):
            assert_bytes_equal(a, b)
        changed = _as_bytes(got)
        if before is not None and sync >= 3:  # the replay read the stepped weights
            assert changed != before
        before = changed
        del got, want
    assert exporter._replay.graphs == 1 and exporter._replay.failed is None


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_the_plans_own_names_are_resolved_and_laid_out_at_construction(family, model):
    # what the first sync would work out for the standard spelling is done in the constructor:
    # that sync finds every name's record and every group's layout already made, and uses them
    hf, config = model(family)
    megatron = hf_to_megatron(hf, family, config)
    exporter = _exporter(config)
    records = dict(exporter._records)
    layouts = [group.layout for group in exporter.groups]
    assert records and all(layout is not None for layout in layouts)
    update = exporter(megatron)
    unresolved = {key for key, t in megatron.items() if (key, tuple(t.shape)) not in records}
    # a vocabulary Megatron pads holds more rows than the plan's: those two resolve at the sync
    assert unresolved <= {"embedding.word_embeddings.weight", "output_layer.weight"}
    assert len(unresolved) < len(megatron) // 10
    assert all(exporter._records[key][1] is record[1] for key, record in records.items())  # pieces reused
    assert all(a is b for a, b in zip((g.layout for g in exporter.groups), layouts, strict=True))
    reference = dict(export_hf(megatron, contract=NVFP4_EXPERTS, family=None, config=config))
    assert sorted(n for n, _ in update) == sorted(reference)
    for name, tensor in update:
        assert_bytes_equal(tensor, reference[name])


def test_names_spelled_otherwise_are_resolved_at_the_first_sync(model):
    # a wrapper prefix and SequentialMLP experts: nothing made at construction fits, same bytes
    hf, config = model("qwen3_moe")
    megatron = hf_to_megatron(hf, "qwen3_moe", config, expert_layout="sequential")
    wrapped = {f"module.{k}": v for k, v in megatron.items()}
    exporter = _exporter(config)
    before = set(exporter._records)
    update = exporter(wrapped)
    assert {(k, tuple(t.shape)) for k, t in wrapped.items()} <= set(exporter._records)
    assert not before & {(k, tuple(t.shape)) for k, t in wrapped.items()}
    reference = dict(export_hf(hf_to_megatron(hf, "qwen3_moe", config), contract=NVFP4_EXPERTS, family=None,
                               config=config))  # fmt: skip
    assert sorted(n for n, _ in update) == sorted(reference)
    for name, tensor in update:
        assert_bytes_equal(tensor, reference[name])
