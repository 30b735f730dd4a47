"""doctor on its corpus: no finding on any healthy checkpoint, every fault found with its tensors named."""

from __future__ import annotations

import pytest
from doctor.corpus import BASES, FAULTS, Fault, copy_base

from fp4convert.doctor import doctor_checkpoint

HEALTHY = sorted(BASES)


@pytest.mark.parametrize("name", HEALTHY)
def test_no_finding_on_a_healthy_checkpoint(name, base, source_of):
    report = doctor_checkpoint(base(name), source=source_of(name))
    assert report.findings == [], "\n".join(line for f in report.findings for line in f.lines())
    assert report.exit_code == 0 and report.engines
    headers = doctor_checkpoint(base(name), headers_only=True)
    assert headers.findings == [] and headers.bytes_read == 0 and headers.mode == "headers"


def _run(fault: Fault, folder, source_of):
    return doctor_checkpoint(
        folder,
        engine=fault.engine,
        source=source_of(fault.base) if fault.with_source else None,
        contract=fault.contract,
    )


@pytest.mark.parametrize("fault", FAULTS, ids=str)
def test_every_fault_is_found_with_its_tensors(fault, base, source_of, tmp_path):
    folder = copy_base(base(fault.base), tmp_path / "damaged")
    if fault.damage is not None:
        fault.damage(folder)
    report = _run(fault, folder, source_of)
    found = report.find(fault.code)
    text = "\n".join(line for f in report.findings for line in f.lines())
    assert found, f"{fault.code} not found; findings:\n{text}"
    named = {t for f in found for t in f.tensors}
    assert set(fault.tensors) <= named, f"{set(fault.tensors) - named} not named; findings:\n{text}"
    allowed = {fault.code, *fault.also} | ({"provenance-unknown"} if fault.with_source else set())
    unexpected = {f.code for f in report.findings} - allowed
    assert not unexpected, f"unexpected findings {unexpected}:\n{text}"
    if found[0].severity == "error":
        assert report.exit_code == 1
