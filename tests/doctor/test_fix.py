"""``--fix DST``: every repairable fault repaired into a new folder that passes doctor (and verify, for
fp4convert's own outputs); the damaged checkpoint is never modified."""

from __future__ import annotations

import pytest
from _helpers import tree_hashes
from doctor.corpus import BASES, FAULTS, copy_base

from fp4convert.doctor.repair import repair_checkpoint
from fp4convert.errors import ConversionError
from fp4convert.verify.checkpoint import verify_checkpoint

REPAIRABLE = [f for f in FAULTS if f.fix is not None]


@pytest.mark.parametrize("fault", REPAIRABLE, ids=str)
def test_fix_repairs_the_fault(fault, base, source_of, tmp_path):
    folder = copy_base(base(fault.base), tmp_path / "damaged")
    if fault.damage is not None:
        fault.damage(folder)
    before = tree_hashes(folder)
    source = source_of(fault.base) if fault.fix == "rederive" else None
    report = repair_checkpoint(folder, tmp_path / "fixed", source=source, contract=fault.contract, engine=fault.engine)
    assert tree_hashes(folder) == before, "the damaged checkpoint was modified"
    assert report.before is not None and fault.code in report.before.codes()
    assert report.after is not None
    text = "\n".join(line for f in report.after.findings for line in f.lines())
    assert report.after.findings == [], f"after --fix ({report.repairs}):\n{text}"
    if BASES[fault.base.partition("|")[0]][0] == "converted":
        verified = verify_checkpoint(tmp_path / "fixed", source=source)
        assert verified.ok, verified.summary()


def test_fix_never_writes_into_the_checkpoint(base, tmp_path):
    folder = copy_base(base("mo-nvfp4"), tmp_path / "ckpt")
    with pytest.raises(ConversionError, match="overlaps"):
        repair_checkpoint(folder, folder / "fixed")
    with pytest.raises(ConversionError, match="overlaps"):
        repair_checkpoint(folder, folder)
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConversionError, match="already exists"):
        repair_checkpoint(folder, tmp_path / "taken")
