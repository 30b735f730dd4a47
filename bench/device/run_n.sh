# Issue 13: run_m again with the hash children's output collected under a lock (run_m's 2 of 3
# failures), failures printed; then the timeline.
sed -i 's/^for i in 1 2 3; do$/for i in 1 2; do/' bench/device/run_m.sh
bash bench/device/run_m.sh
