#!/usr/bin/env bash
# The commands behind the README's measured tables (CPU; pass --device cuda for a GPU).
# Each writes results.json and PNG plots to its own folder under ${OUT:-leanbatch-results}.
# Benchmarks, not tests: run them one at a time, on a quiet machine if you can (results.json
# records the load average at the start and end of every run, so a disturbed run can be told
# from a clean one). The long runs use one torch thread: on a 2-core machine shared with other
# work, two OpenMP threads per process were up to 20x slower per step whenever another process
# was busy, one thread at most 1.5x; the ratios in a table compare runs of one invocation.
set -euo pipefail
OUT=${OUT:-leanbatch-results}
MNIST=${MNIST:-../shared/data/mnist.npz}   # any .npz with x_train/y_train/x_test/y_test
CIFAR=${CIFAR:-.data/cifar10}             # tar -xJf ../shared/data/cifar10-jpeg.tar.xz -C .data/cifar10

# 1. The first look: 5,000 bundled MNIST digits, every method and the baseline at budgets
#    0.5, 0.7, 0.85 and 1, three seeds (the README's main command).
leanbatch bench --quick --out "$OUT/quick"
# ... and every method of the bench on the same digits (the method study's screen).
leanbatch bench --quick --threads 1 --out "$OUT/quick-methods" \
  --methods 'baseline,random,infobatch,infobatch[max_weight=1],infobatch[warmup_epochs=1],rs2,epsilon-greedy,ucb,seta,obs,obs[keep=0.7],sb,sb-proxy,infobatch+sb'

if [ -f "$MNIST" ]; then
  # 2. Full MNIST (60k/10k), 8 epochs, three seeds, every method and the budgets.
  leanbatch bench --data "$MNIST" --epochs 8 --seeds 0,1,2 --threads 1 --out "$OUT/mnist" \
    --methods 'baseline,random,infobatch,infobatch+sb,obs,obs[keep=0.7]'
  # (the first run, with Selective Backprop alone: the default methods, into "$OUT/mnist-first")
  leanbatch bench --data "$MNIST" --epochs 8 --seeds 0,1,2 --threads 1 --out "$OUT/mnist-first"
fi

if [ -d "$CIFAR" ]; then
  # 3. CIFAR-10, the small CNN: the cifar10 preset (15 epochs, seeds 0,1,2, crop + flip).
  leanbatch bench --preset cifar10 --data "$CIFAR" --threads 1 --out "$OUT/cifar10-cnn"

  # 4. CIFAR-10, the compact ResNet, narrowed to 16/32/64 channels and 4 epochs to fit 2 cores.
  leanbatch bench --preset cifar10 --data "$CIFAR" --model resnet --widths 16,32,64 --epochs 4 \
    --budgets 0.6,0.8,1 --threads 1 --out "$OUT/cifar10-resnet"

  # 5. The method study: InfoBatch's short-schedule options and the newer rules, CNN, 12 epochs.
  leanbatch bench --preset cifar10 --data "$CIFAR" --epochs 12 --budgets 0.6,0.8,1 --threads 1 \
    --methods 'baseline,infobatch,infobatch[max_weight=1],infobatch[warmup_epochs=1],seta,rs2,ucb,obs[keep=0.7]' \
    --out "$OUT/cifar10-study"
  leanbatch bench --preset cifar10 --data "$CIFAR" --epochs 12 --budgets 0.5,0.7,0.85 --threads 1 \
    --methods 'obs,infobatch[warmup_epochs=2]' --out "$OUT/cifar10-study-b"
fi

# 6. Micro-benchmarks: planning time and memory up to 100M samples, update() and selection cost.
leanbatch micro plan --sizes 1280000,10000000,100000000 --json "$OUT/micro-plan.json"
leanbatch micro update --json "$OUT/micro-update.json"
leanbatch micro select --json "$OUT/micro-select.json"
# ... sharded scores and plans: 8 ranks simulated in turns at 100M samples (docs/results.md)
mkdir -p "$OUT/sharded"
leanbatch micro plan --world 8 --shard --sizes 100000000 --repeats 3 --json "$OUT/sharded/micro-plan-world8.json"
leanbatch micro plan --sizes 100000000 --repeats 3 --json "$OUT/sharded/micro-plan-unsharded.json"
# ... update() and planning against the commit before the distributed work, in one process
python benchmarks/ab_update.py --ref 02b1ad1
python benchmarks/ab_update.py --ref 02b1ad1 --plan 10000000 --rounds 5
# ... the pruning methods on the quick preset (run at 2ce15d6 for keyed-before, cf4ab8e for keyed-after)
leanbatch bench --quick --methods baseline,infobatch,random,ucb,rs2,seta,epsilon-greedy \
  --budgets none --batch-budgets none --threads 1 --out "$OUT/keyed-after"

if [ -d "$CIFAR" ]; then
  # 7. The envelope and the twins (issue 16): CIFAR-10 at 12 epochs and at 20 epochs, 3 seeds each.
  leanbatch bench --preset cifar10 --data "$CIFAR" --epochs 12 --seeds 0,1,2 --threads 1 --controls \
    --budgets 0.5,0.7,0.85,1 --batch-budgets 0.5,0.7 --out "$OUT/cifar10-envelope-12ep" \
    --methods 'baseline,infobatch,random,obs,obs[keep=0.7],obs-epoch,ucb,sb,rho-loss'
  # 20 epochs, 3 seeds, in two parts (one per core), merged into one report
  for part in "0 0,1 a" "1 2 b"; do
    set -- $part
    taskset -c "$1" leanbatch bench --preset cifar10 --data "$CIFAR" --epochs 20 --seeds "$2" --threads 1 \
      --controls --budgets 0.5,0.7,0.85,1 --batch-budgets 0.5,0.7 --out "$OUT/cifar10-20ep-$3" \
      --methods 'baseline,infobatch,random,obs,obs[keep=0.7],obs-epoch,ucb,sb' &
  done
  wait
  leanbatch report "$OUT/cifar10-20ep-a" "$OUT/cifar10-20ep-b" --out "$OUT/cifar10-envelope-20ep"
  # ... the score rows' per-step cost under torchrun (2 gloo processes), four ways, 600 steps an arm
  # (CIFAR-10's and MNIST's shapes; results/torchrun-cifar10 was measured by the bench before it became
  # task-free: the image task now trains in one process)
  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 benchmarks/sync_cost.py
  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 benchmarks/sync_cost.py --shape 1,28,28
fi
if [ -f "$MNIST" ]; then
  # 8. The envelope and the twins on full MNIST, 8 epochs, 3 seeds.
  leanbatch bench --data "$MNIST" --epochs 8 --seeds 0,1,2 --threads 1 --controls \
    --budgets 0.5,0.7,0.85,1 --batch-budgets 0.5,0.7 --out "$OUT/mnist-envelope-8ep" \
    --methods 'baseline,infobatch,random,obs,obs[keep=0.7],obs-epoch,ucb,sb,rho-loss'
fi
# 9. A distributed task, one torchrun job per arm, merged into one study (docs/bench.md#outgrowing-one-machine).
for part in "baseline --budgets 0.5,1 --batch-budgets 0.5" "infobatch --budgets none --batch-budgets none"; do
  set -- $part
  OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 -m leanbatch bench --task examples/distributed_task.py:train \
    --metric accuracy --seeds 0,1,2 --methods "$@" --out "$OUT/distributed-$1"
done
leanbatch report "$OUT/distributed-baseline" "$OUT/distributed-infobatch" --out "$OUT/distributed"
# 10. The LR rule for smaller batches, both ways.
for rule in same scaled; do
  leanbatch bench --quick --controls --methods 'baseline,obs,obs[keep=0.7],sb' --lr-rule $rule --threads 1 \
    --out "$OUT/lr-rule-$rule"
done
