# Stop 41 (issue 15), for an H200 (an H100 runs it too: 36 layers). (1) bench/device/nvfp4_ab.py,
# alternating, ROUNDS (2) rounds, as PACK:AMAX:PREFETCH (FP4CONVERT_E2M1_PACK, FP4CONVERT_BF16_AMAX,
# FP4CONVERT_PREFETCH): stop 40's default horner:mask:0, this stop's horner:xorsign:0 (the block maxima
# by max.xorsign.abs.bf16x2, no sign masks), stop 39's shift:mask:0, horner-hi:xorsign:0 (fewest ALU
# instructions), horner:xorsign:1 (the next column step read ahead: off since stop 37 on an H100's
# figures; meant for the H200's latency-bound pass). (2) Every GPU test of tests/formats and
# tests/megatron with the defaults (the word-path tests try every way). (3) The 48-layer sync rows
# with kernel rows. Everything also goes to $OUT/run.txt. NO_TESTS: skip (2); TESTS_K: only the tests
# pytest -k selects; NO_SYNC: skip (3).
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
for i in $(seq ${ROUNDS:-2}); do
  for v in horner:mask:0 horner:xorsign:0 shift:mask:0 horner-hi:xorsign:0 horner:xorsign:1; do
    IFS=: read -r pack amax ahead <<< "$v"
    echo "== $v"
    FP4CONVERT_E2M1_PACK=$pack FP4CONVERT_BF16_AMAX=$amax FP4CONVERT_PREFETCH=$ahead \
      timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  done
done
[ -z "$NO_TESTS" ] && { echo "== every GPU test"; timeout 170 $P -m gpu tests/formats tests/megatron -n 12 -rfE ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -3; }
[ -z "$NO_SYNC" ] && SYNC_TIMEOUT=200 bash bench/device/sync_rows.sh defaults
