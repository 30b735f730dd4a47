set -x
. bench/device/setup.sh
timeout 75 python3 -m pytest -m gpu tests/sources/test_families_gpt_oss.py tests/sources/test_families_fp8.py -q --durations=5 -p no:cacheprovider 2>&1 | tail -12 | tee $OUT/gpu-tests-wiring-h200.txt
timeout 60 python3 -m pytest tests/distributed/test_gpu_ranks.py -m gpu -q -rs --durations=5 -p no:cacheprovider 2>&1 | tail -12 | tee $OUT/gpu-ranks-tests-h200.txt
timeout 130 python3 bench/distributed.py --devices cpu,cuda --procs 4 --cuda-procs 2 --no-single-thread --workdir /tmp/fd 2>&1 | tee $OUT/distributed-h200.txt | tail -45; rm -rf /tmp/fd
timeout 240 python3 -m pytest -m gpu tests/megatron tests/formats/test_cuda.py -q -rf --durations=15 -p no:cacheprovider 2>&1 | tail -40 | tee $OUT/gpu-tests-livesync-h200.txt
