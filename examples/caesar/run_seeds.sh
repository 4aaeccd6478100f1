#!/usr/bin/env bash
# The worked example over seeds: one warm start on the training rows (the default: stops at training
# accuracy 0.5), then SFT, GRPO and CHORD for 40 steps from it, seeds 1..N (default 4), one torch
# thread each. Then: python examples/caesar/what_rl_adds.py runs/caesar-seeds
# Run from the repository root: bash examples/caesar/run_seeds.sh [N]
set -euo pipefail
n=${1:-4}
out=runs/caesar-seeds
D="data.source=examples/caesar/train.jsonl reward.name=examples/caesar/reward.py:shifted"
M=$(mixrl model build-tiny $D --quiet | sed -n 's/^next: .*model.path=\([^ ]*\).*/\1/p')
for s in $(seq 1 "$n"); do
  for a in sft grpo chord; do
    mixrl train $D model.path="$M" algo=$a seed=$s trainer.max_steps=40 hardware.torch_threads=1 \
      run_dir=$out/caesar-$a-s$s --quiet > /dev/null
    echo "$a seed $s: $(python -c "import json,sys; s=json.load(open(sys.argv[1])); print(s['accuracy_before'], '->', s['accuracy_after'])" $out/caesar-$a-s$s/summary.json)"
  done
done
