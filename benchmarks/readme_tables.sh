#!/usr/bin/env bash
# The commands behind the README's measured tables (CPU; pass --device cuda for a GPU).
# Each writes results.json and PNG plots to its own folder under ${OUT:-leanbatch-results}.
# Benchmarks, not tests: run them on a quiet machine (results.json records the load average
# at the start and end of every run, so a disturbed run can be told from a clean one).
set -euo pipefail
OUT=${OUT:-leanbatch-results}
MNIST=${MNIST:-../shared/data/mnist.npz}   # any .npz with x_train/y_train/x_test/y_test

# 1. The first look: 5,000 bundled MNIST digits, all five methods, three seeds (~1.5 min).
leanbatch bench --quick --out "$OUT/quick"

if [ -f "$MNIST" ]; then
  # 2. Full MNIST (60k/10k), 8 epochs, three seeds, all five methods (~18 min on 2 cores).
  leanbatch bench --data "$MNIST" --epochs 8 --seeds 0,1,2 --out "$OUT/mnist"

  # 3. Longer training, Selective Backprop on every batch of its window, and stacking (~25 min).
  leanbatch bench --data "$MNIST" --epochs 12 --seeds 0,1,2 --out "$OUT/mnist-12" \
    --methods 'baseline,infobatch,sb[sb_interrupt=0],infobatch+sb'
fi

# 4. Micro-benchmarks: planning time and memory up to 100M samples, update() and selection cost.
leanbatch micro plan --sizes 1280000,10000000,100000000 --json "$OUT/micro-plan.json"
leanbatch micro update --json "$OUT/micro-update.json"
leanbatch micro select --json "$OUT/micro-select.json"
