#!/usr/bin/env bash
# Recorded agents at fixed session concurrency past the KV cliff (issue 40), EMULATED on the H100 +
# Llama-3.1-8B profile with its real pool (454k tokens) and a 200 GB host tier (1.53M tokens).
# Every figure is a PREDICTION. Reports: docs/results/recorded-sessions/*/report.md.
#   bash scripts/recorded_sessions.sh [OUT]     (default docs/results/recorded-sessions; ~2.5 h on 2 cores alone)
# Per-run files land in RUNS (default /tmp/recorded-sessions) and are not committed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-docs/results/recorded-sessions}
RUNS=${RUNS:-/tmp/recorded-sessions}
H100=configs/profiles/h100-sglang-llama-3.1-8b.json
CC=workloads/imported/claude-code-kvtester.jsonl
MS=workloads/imported/lmcache-miniswe.jsonl
HOST="--hicache-size 200"
STOCK_HOST=fcfs+hicache,lpm+hicache,fcfs+hicache-write-back,lpm+hicache-write-back

sessions() { # NAME WORKLOAD POLICIES N-LIST SEEDS [extra bench flags]
    local name=$1 wl=$2 policies=$3 n=$4 seeds=$5
    shift 5
    "$PY" -m continuum_lab.cli.bench --emulate "$H100" --workload "$wl" --policies "$policies" --sessions "$n" \
        --seeds "$seeds" --window-s 1200 --warmup-s 600 --server-args "$HOST" --jobs 2 --out "$RUNS/$name" "$@"
    mkdir -p "$OUT/$name"
    # report.json stays with the runs; a grid at one N has no plots
    cp "$RUNS/$name"/report.md $(compgen -G "$RUNS/$name/*.png" || true) "$OUT/$name/"
}

# the N sweep, think/tool gaps capped at 10 s (ThunderAgent's protocol): every policy, seed 1
sessions claude-code-capped "$CC" "fcfs,lpm,$STOCK_HOST,continuum,continuum+hicache" 4,16,32,96 1 --max-gap-s 10
# past the host cliff over seeds (seed 1's runs are the sweep's)
mkdir -p "$RUNS/claude-code-capped-seeds/runs"
cp "$RUNS"/claude-code-capped/runs/{fcfs,lpm,continuum}+hicache-n96-s1-r0.json "$RUNS/claude-code-capped-seeds/runs/"
sessions claude-code-capped-seeds "$CC" fcfs+hicache,lpm+hicache,continuum+hicache 96 1,2,3 --max-gap-s 10 --reuse-runs
# the recorded gaps, uncapped, past the host cliff
sessions claude-code-raw "$CC" fcfs+hicache,lpm+hicache,continuum+hicache 96 1,2,3
# mini-swe-agent (contexts ~10k tokens, gaps of 1-4 s): the host cliff is near 300 sessions; shorter
# windows, since its sessions are short and its runs slow to emulate (many small decode steps)
sessions miniswe-host-cliff "$MS" "fcfs+hicache,lpm+hicache,continuum+hicache,fcfs+hicache-write-back,lpm+hicache-write-back" 320 1,2,3 --max-gap-s 10 --warmup-s 300 --window-s 300
sessions miniswe-capped "$MS" "fcfs+hicache,lpm+hicache,continuum+hicache,fcfs,lpm,continuum" 96,16 1 --max-gap-s 10 --warmup-s 300 --window-s 300
# past the device cliff without a host tier, the Claude Code protocol (600 s warm-up, 1200 s window):
# the 300 s window above ends inside the cold start
HOST= sessions miniswe-no-host "$MS" fcfs,lpm,continuum 96 1,2,3 --max-gap-s 10
