# Stop 45 (issue 15), on an H200 if one comes: the H200 rows with the current defaults (PDL on,
# runs on, device="auto"): (1) bench/device/nvfp4_ab.py with PDL on and off (each row's bytes against
# the CPU's); (2) the sync rows (48 layers on an H200) with the kernel rows.
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for pdl in 2 0; do echo "== nvfp4_ab.py FP4CONVERT_PDL=$pdl"
  NVFP4_AB_SHORT=1 FP4CONVERT_PDL=$pdl timeout 60 python3 bench/device/nvfp4_ab.py | grep -E "amax|te 1x16|Error"; done
SYNC_TIMEOUT=${SYNC_TIMEOUT:-270} bash bench/device/sync_rows.sh defaults
