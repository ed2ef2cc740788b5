#!/usr/bin/env bash
# Issue 23: import the field's agent traces and run fcfs / lpm / continuum on them, EMULATED.
#   bash scripts/imported_traces.sh import KVTESTER_DIR LMCACHE_DIR   # workloads/imported/*.jsonl
#   bash scripts/imported_traces.sh grids                               # docs/results/imported/*/
# (per-run files land in OUT/runs/ and are not committed; the ablations in
# docs/results/imported/ablations/ name their flags in their report.md)
# KVTESTER_DIR: a checkout of github.com/callanjfox/kv-cache-tester (94f6046d);
# LMCACHE_DIR: of github.com/LMCache/lmcache-agent-trace (16a14ada). See workloads/imported/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
W=workloads/imported
R=docs/results/imported
H100=configs/profiles/h100-sglang-llama-3.1-8b.json

scale() { # SRC DST S: every token count times S, rounded, at least 1 (generate's rule); tool times kept
    "$PY" - "$@" <<'EOF'
import sys, orjson
src, dst, s = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(src, "rb") as f, open(dst, "wb") as g:
    for line in f:
        p = orjson.loads(line)
        for t in p["turns"]:
            t["append_tokens"] = max(1, round(t["append_tokens"] * s))
            t["output_tokens"] = max(1, round(t["output_tokens"] * s))
        g.write(orjson.dumps(p) + b"\n")
EOF
}

h100() { # NAME WORKLOAD JPS [extra bench flags]: fcfs/lpm/continuum x seeds 1-3 on the H100 profile
    local name=$1 wl=$2 jps=$3
    shift 3
    "$PY" -m continuum_lab.cli.bench --emulate "$H100" --workload "$wl" --policies fcfs,lpm,continuum \
        --seeds 1,2,3 --jobs 1 --summary-only --jps "$jps" --out "$R/$name-h100" "$@"
}

cpu() { # NAME WORKLOAD JPS [extra bench flags]: the same on the CPU profile (tiny Llama), pool ~3 programs
    local name=$1 wl=$2 jps=$3
    shift 3
    "$PY" -m continuum_lab.cli.bench --emulate configs/profiles/cpu-tiny-llama-bench.json \
        --prefill-profile configs/profiles/cpu-tiny-llama.json --model .models/tiny-llama --pool-programs 3 \
        --workload "$wl" --policies fcfs,lpm,continuum --seeds 1,2,3 --jobs 1 --summary-only --jps "$jps" \
        --out "$R/$name-cpu" "$@"
}

case "${1:-}" in
import)
    kv=$2 lm=$3
    "$PY" -m continuum_lab.workloads.importer "$kv"/traces/*.json --format weka --max-context 128000 \
        --out $W/claude-code-kvtester.jsonl 2>/dev/null
    for d in miniswe taubench magagent; do
        "$PY" -m continuum_lab.workloads.importer "$lm"/$d/*.jsonl --format lmcache --max-context 128000 \
            --out $W/lmcache-$d.jsonl
    done
    scale $W/claude-code-kvtester.jsonl $W/claude-code-kvtester-cpu.jsonl 0.05
    scale $W/lmcache-miniswe.jsonl $W/lmcache-miniswe-cpu.jsonl 0.4
    scale $W/lmcache-magagent.jsonl $W/lmcache-magagent-cpu.jsonl 0.3
    ;;
grids)
    # Pools of the lmcache runs: ~3 average contexts and at least the largest program (the
    # CPU bench's --pool-programs 3 rule), since an H100's 454k-token pool holds them all.
    h100 claude-code $W/claude-code-kvtester.jsonl 0.2 --programs 12
    # every policy overloaded: 100 sessions at 0.06/s on the full pool, two seeds (~23 minutes)
    h100 claude-code-overload $W/claude-code-kvtester.jsonl 0.06 --programs 100 --seeds 1,2
    h100 miniswe $W/lmcache-miniswe.jsonl 0.2 --max-total-tokens 39794
    h100 taubench $W/lmcache-taubench.jsonl 2 --max-total-tokens 2184
    h100 magagent $W/lmcache-magagent.jsonl 0.3 --programs 40 --max-total-tokens 29273
    cpu claude-code $W/claude-code-kvtester-cpu.jsonl 1 --programs 100
    cpu miniswe $W/lmcache-miniswe-cpu.jsonl 0.2
    cpu taubench $W/lmcache-taubench.jsonl 2
    cpu magagent $W/lmcache-magagent-cpu.jsonl 0.3 --programs 60
    "$PY" -m continuum_lab.cli.imported_figures $R/*-h100 $R/*-cpu --write $R
    ;;
*)
    sed -n 2,8p "$0"
    exit 2
    ;;
esac
