# This stop's device batch: the GPU tests of formats and megatron (uploads, segment tables), the
# first-call profile, one round of conversions, a CUDA conversion compared with the CPU's.
timeout 200 python3 -m pytest -m gpu tests/formats/test_cuda.py tests/megatron tests/convert -q -n 8 -rf -p no:cacheprovider 2>&1 | tail -8
bash bench/device/run_p.sh
