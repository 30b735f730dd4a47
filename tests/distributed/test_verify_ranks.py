"""``verify`` split across ranks: each rank checks its share, the report is the single-process one."""

from __future__ import annotations

import shutil
from collections import Counter

from _helpers import NVFP4_EXPERTS

from fp4convert.checkpoint.safetensors_io import SafetensorsFile
from fp4convert.verify.checkpoint import verify_checkpoint


def kinds(checks) -> Counter:
    return Counter((c["name"], c["check"], c["ok"]) for c in checks)


def test_three_ranks_give_the_single_process_verdict_and_checks(clusters, converted, tiny_checkpoint, tmp_path):
    src = tiny_checkpoint("qwen3_moe")
    out = shutil.copytree(converted("qwen3_moe", "modelopt", NVFP4_EXPERTS), tmp_path / "out")
    alone = verify_checkpoint(out, source=src)
    got = clusters(3).run("verify", str(out), source=str(src))
    assert all(r["ok"] for r in got.values()), got
    for r in got.values():
        report = r["result"]
        assert report["ok"] and report["compared_with_source"]
        assert report["checks"] == len(alone.checks)

    # Flip one byte of one expert's data in the last shard: the rank holding it finds it.
    shard = sorted(out.glob("*.safetensors"))[-1]
    with SafetensorsFile(shard) as f:
        name = next(n for n in f.entries if n.endswith("experts.3.down_proj.weight") or n.endswith(".weight"))
        offset = f.entries[name].start
    raw = bytearray(shard.read_bytes())
    raw[offset] ^= 0x11
    shard.write_bytes(bytes(raw))
    alone = verify_checkpoint(out, source=src)
    got = clusters(3).run("verify", str(out), source=str(src))
    for r in got.values():
        report = r["result"]
        assert not report["ok"] and report["checks"] == len(alone.checks)
        assert kinds(report["failures"]) == kinds([c.__dict__ for c in alone.failures])
        assert {f["check"] for f in report["failures"]} == {"sha256", "source"}
