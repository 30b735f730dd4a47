# Stop 45 (issue 15), the first part of run_45b.sh alone, for an H200 with little budget left: the
# amax + quantize row (bench/device/nvfp4_ab.py, PDL on and off; each row's bytes against the CPU's).
exec > >(tee $OUT/run.txt) 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for pdl in 2 0 2; do echo "== nvfp4_ab.py FP4CONVERT_PDL=$pdl"
  NVFP4_AB_SHORT=1 FP4CONVERT_PDL=$pdl timeout 60 python3 bench/device/nvfp4_ab.py | grep -E "amax|te 1x16|Error"; done
