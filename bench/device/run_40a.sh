# Stop 40 (issue 15), an H200 where one is lent (else an H100: 36 layers). (1) The word-path tests of
# tests/formats/test_cuda.py (every bf16 in every nibble for each way of gathering the codes, and the
# NVFP4 launches against the CPU's bytes) under FP4CONVERT_E2M1_PACK=shift and horner-hi (horner, the
# default since stop 40, runs in (4)). (2) bench/device/nvfp4_ab.py, alternating, two rounds: shift,
# horner, horner-hi: the gathering on the ALU pipe or by integer multiply-adds on the FMA pipe. (3) The sync rows with
# the defaults (export_hf of a dict's items now one whole update, replayed; an iterator streamed).
# (4) tests/megatron and every other GPU test of tests/formats. Everything also goes to $OUT/run.txt.
# ROUNDS=1: one round of (2); NO_SYNC: stop after (2); NO_FULL: after (3).
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader; nproc
P="python3 -m pytest -o addopts=--import-mode=importlib -p no:cacheprovider -q"
for v in shift horner-hi; do
  echo "== tests, FP4CONVERT_E2M1_PACK=$v"
  FP4CONVERT_E2M1_PACK=$v timeout 90 $P -m gpu tests/formats/test_cuda.py -n 12 -rfE -k "segment or large or dense or bf16_word" 2>&1 | tail -2
done
for i in $(seq ${ROUNDS:-2}); do
  for v in shift horner horner-hi; do
    echo "== FP4CONVERT_E2M1_PACK=$v"; FP4CONVERT_E2M1_PACK=$v timeout 40 python3 bench/device/nvfp4_ab.py | grep -v modelopt
  done
done
[ -n "$NO_SYNC" ] && exit 0
SYNC_TIMEOUT=170 bash bench/device/sync_rows.sh defaults
[ -n "$NO_FULL" ] && exit 0
echo "== every GPU test"; timeout 150 $P -m gpu tests/formats tests/megatron -n 12 -rfE 2>&1 | tail -3
