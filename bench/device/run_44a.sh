# Stop 44 (issue 15). (1) bench/device/nvfp4_ab.py (te 1x16, amax, amax + quantize; each row's bytes
# against the CPU's) under the stop-43 knobs of _triton_segments that stop 43's batch paired only with
# pipelined loops (FP4CONVERT_STAGES=3, which costs 1.8x): PDL:KEEP_MB:OUT (FP4CONVERT_PDL,
# FP4CONVERT_L2_KEEP_MB, FP4CONVERT_OUT_POLICY), loops unpipelined, ROUNDS rounds (2) alternating,
# the defaults first and last; (2) the sync rows (bench/device/sync_rows.sh defaults). NO_SYNC skips (2).
# Everything also goes to $OUT/run.txt.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
for round in $(seq ${ROUNDS:-2}); do
  for v in 0:0: 1:0: 2:0: 0:20: 0:40: 2:40: 0:40:evict_first 2:40:evict_first 0:0:; do
    IFS=: read -r pdl keep out <<< "$v"
    echo "== round $round PDL:KEEP_MB:OUT $v"
    NVFP4_AB_SHORT=1 FP4CONVERT_PDL=$pdl FP4CONVERT_L2_KEEP_MB=$keep FP4CONVERT_OUT_POLICY=$out \
      timeout 60 python3 bench/device/nvfp4_ab.py | grep -E "amax|te 1x16|Error"
  done
done
[ -z "$NO_SYNC" ] && SYNC_TIMEOUT=240 bash bench/device/sync_rows.sh defaults
