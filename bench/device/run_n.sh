# Issue 13: run_m again with the hash children's output collected under a lock (run_m's 2 of 3
# failures), failures printed; then the timeline.
RUNS=2 bash bench/device/run_m.sh
