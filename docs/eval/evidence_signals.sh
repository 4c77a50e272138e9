#!/usr/bin/env bash
# The fedavg federations whose stored signals docs/eval/evidence_whatif.py judges (30 rounds;
# SEEDS="0 1" for two seeds). Run from an empty directory: docs/eval/evidence_signals.sh
F=${FEDAUDIT:-$(cd "$(dirname "$0")/../.." && pwd)/.venv/bin/fedaudit}
R=${ROUNDS:-30}
run() { name=$1; shift; for s in ${SEEDS:-0}; do
  [ -f $name-s$s/results.json ] && continue
  $F simulate "$@" --rounds $R --method fedavg --seed $s --out $name-s$s --no-progress --no-plots > $name-s$s.log 2>&1 || echo "FAIL $name $s"; done; }
run clean6-bm --dataset breastmnist --clients 6 --partition iid --noise none
run small6-bm --dataset breastmnist --clients 6 --partition iid --noise rho_range --noise-param rho=0.34 --noise-param lo=0.7 --noise-param hi=0.9
run shards-pf --dataset digits --clients 20 --partition shards --noise rho_range --noise-param rho=0.25 --noise-param lo=0.3 --noise-param hi=0.5 --flip pairflip
run corrupt-bc --dataset breast_cancer --clients 10 --partition iid --noise truncated_gaussian --noise-param mu=0.5 --noise-param sigma=0.3
run pf-dir --dataset digits --clients 20 --partition dirichlet --partition-param beta=0.3 --noise rho_range --noise-param rho=0.3 --noise-param lo=0.3 --noise-param hi=0.5 --flip pairflip
run mild --dataset digits --clients 20 --partition iid --noise rho_range --noise-param rho=0.3 --noise-param lo=0.1 --noise-param hi=0.3
run single50 --dataset digits --clients 50 --partition iid --noise rho_range --noise-param rho=0.02 --noise-param lo=0.3 --noise-param hi=0.3
run clean20-dir --dataset digits --clients 20 --partition dirichlet --partition-param beta=0.5 --noise none
run clean5-bc --dataset breast_cancer --clients 5 --partition iid --noise none
run clean10-pn --dataset pneumoniamnist --clients 10 --partition dirichlet --partition-param beta=1.0 --noise none
echo ALLDONE
