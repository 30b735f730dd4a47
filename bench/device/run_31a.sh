# Stop 31, first batch (issue 15): where the host time goes. The host time of one public quantize
# call with cProfile's top functions (call_overhead.py); a steady 48-layer export and validate, wall
# time against the GPU's busy time, cProfile's top functions (validate_profile.py).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 150 python3 bench/device/call_overhead.py --calls 2000 > $OUT/call_overhead.txt 2>&1; head -14 $OUT/call_overhead.txt
timeout 360 python3 bench/device/validate_profile.py 48 > $OUT/validate_profile.txt 2>&1; grep "^==" $OUT/validate_profile.txt
