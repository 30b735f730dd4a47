"""The native kernel's E2M1 rounding (one float add on the bits) against the torch codec's threshold
comparisons on every one of the 2^32 float32 patterns, both sign rules: a check, not a benchmark,
kept here because it takes minutes (about 4 on 2 cores); CI checks the risky patterns
(tests/formats/test_native_units.py), the GPU all 2^32 (tests/formats/test_cuda.py).

An outer amax of 2688 and block amaxes of 6 give every block the factor 1 (scale byte 0x38), so the
kernel's codes are the rounding of the values themselves.

    python bench/e2m1_all_patterns.py
"""

from __future__ import annotations

import time

import torch

from fp4convert.formats import kernels, profiles
from fp4convert.formats.codecs import e2m1_encode

CHUNK = 1 << 26  # patterns per call: 256 MB of float32


def main() -> None:
    started = time.perf_counter()
    differing = 0
    for profile in ("te", "modelopt"):  # the sign bit (-0 signed), and the sign of y < 0
        signed_zero = profiles.profile_spec(profile).chain != "modelopt"
        for start in range(0, 1 << 32, CHUNK):
            bits = torch.arange(start, start + CHUNK, dtype=torch.int64)
            y = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)
            y = y.reshape(-1, 1024)
            block_amax = torch.full((y.shape[0], 1024 // 16), 6.0)
            data, scale = kernels.nvfp4_units(y, torch.tensor([2688.0]), y.shape[0], profile, block_amax)
            codes = e2m1_encode(y, signed_zero=signed_zero).to(torch.uint8)
            wrong = int((data != (codes[:, 0::2] | (codes[:, 1::2] << 4))).sum()) + int((scale != 0x38).sum())
            if wrong:
                print(f"{profile}: {wrong} bytes differ among patterns {start:#010x}..", flush=True)
            differing += wrong
        print(f"{profile}: done, {time.perf_counter() - started:.0f} s", flush=True)
    print(f"all 2^32 float32 patterns, both sign rules: {differing} bytes differ")


if __name__ == "__main__":
    main()
