#!/usr/bin/env bash
# The GPU run: a real transformer on the GPU behind LlmsloMiddleware, `llmslo load` against it with
# `llmslo gpu sample` beside it, then `llmslo gpu correlate`; the stores and the figures land in $OUT.
#
# Where: the GPU machine (no network; torch and transformers there). The Python packages it lacks travel as
# wheels in .whl/ (duckdb, polars and polars-runtime unpacked and packed as .whl/site.tar.xz, to fit the
# transfer limit); without .whl/ the packages are expected installed. The repository root is the package.
# Locally, on a machine without a GPU: GPU_ENGINE_SIZE=cpu-stub OUT=/tmp/out bench/gpu_run.sh (the sampler then
# says there is no NVML, and the correlation has no GPU samples: that run checks the plumbing only).
#
# Settings (environment): GPU_ENGINE_SIZE (1b | 160m | cpu-stub; default 1b), GPU_ENGINE_SLOTS (8), LOAD_S (90),
# PORT (18400). The rate is half the capacity the calibration measures, tripled for 20 s from 30 s.
set -u -o pipefail
OUT=${OUT:-$PWD/gpu-run-out}
mkdir -p "$OUT"
REPO=$(cd "$(dirname "$0")/.." && pwd)
SIZE=${GPU_ENGINE_SIZE:-1b}
SLOTS=${GPU_ENGINE_SLOTS:-8}
LOAD_S=${LOAD_S:-90}
PORT=${PORT:-18400}
URL=http://127.0.0.1:$PORT
export COLUMNS=220 PYTHONUNBUFFERED=1
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log"; }
run() { log "\$ $*"; "$@" 2>&1 | tee -a "$OUT/run.log"; }

PY=${PY:-python3}
if [ -d "$REPO/.whl" ] && ! $PY -c "import duckdb, polars, uvicorn" 2>/dev/null; then
  log "installing the carried packages into /tmp/site"
  $PY -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall('/tmp/site', filter='data')" \
    "$REPO/.whl/site.tar.xz" || exit 1
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$REPO"/.whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
mkdir -p /tmp/llmslo-pkg && ln -sfn "$REPO" /tmp/llmslo-pkg/llmslo
export PYTHONPATH=/tmp/llmslo-pkg${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d /tmp/llmslo-gpu-run.XXXXXX)
cd "$WORK" || exit 1
llmslo() { $PY -m llmslo.cli "$@"; }

SERVER= SAMPLER=
stop_all() {
  [ -n "$SAMPLER" ] && kill -TERM "$SAMPLER" 2>/dev/null
  [ -n "$SERVER" ] && kill -TERM "$SERVER" 2>/dev/null
  return 0
}
trap stop_all EXIT

command -v nvidia-smi >/dev/null && run nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
run $PY -c "import sys, duckdb, polars, uvicorn; print(sys.version.split()[0], 'duckdb', duckdb.__version__, 'polars', polars.__version__)"

log "starting the engine ($SIZE, $SLOTS slots) with LlmsloMiddleware on $URL"
GPU_ENGINE_SIZE=$SIZE GPU_ENGINE_SLOTS=$SLOTS GPU_ENGINE_MODEL=llama-random-$SIZE LLMSLO_MODEL=llama-random-$SIZE \
LLMSLO_VERSION=gpu-$SIZE LLMSLO_SUMMARY_PATH=$WORK/server LLMSLO_TENANT_HEADER=X-Tenant-Class \
  $PY -m uvicorn --factory llmslo.bench.gpu_engine:app --host 127.0.0.1 --port "$PORT" --log-level warning \
  --no-access-log > server.log 2>&1 &
SERVER=$!
for _ in $(seq 1 240); do
  $PY -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$URL/health" 2>/dev/null \
    && break
  kill -0 "$SERVER" 2>/dev/null || { log "the engine exited"; cat server.log | tee -a "$OUT/run.log"; exit 1; }
  sleep 0.5
done
run $PY -c "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1]).read().decode())" "$URL/v1/models"

log "calibrating: one stream, then $SLOTS at once (128 tokens each)"
$PY -m llmslo.bench.gpu_engine calibrate "$URL" --slots "$SLOTS" --max-tokens "${CAL_TOKENS:-128}" > "$OUT/calibration.json" \
  || { log "calibration failed"; cat server.log | tee -a "$OUT/run.log"; exit 1; }
cat "$OUT/calibration.json" | tee -a "$OUT/run.log"
# capacity in requests/s at a mean of 160 generated tokens; the run takes half of it, and three times that in the burst
RATE=$($PY -c "import json; c = json.load(open('$OUT/calibration.json')); lo, _, hi = '${OUTPUT_TOKENS:-64-256}'.partition('-'); print(round(0.5 * c['aggregate_tokens_per_s'] / ((int(lo) + int(hi or lo)) / 2), 3))")
log "rate: $RATE requests/s (x3 from 30 s for 20 s)"

# a background job of a script ignores SIGINT, so the sampler stops by its own --duration
llmslo gpu sample --db run.duckdb --interval 250ms --duration "$((LOAD_S + 20))s" > sampler.log 2>&1 &
SAMPLER=$!
sleep 3
log "\$ llmslo load $URL --rate $RATE --duration ${LOAD_S}s ... --db client.duckdb --json (load.json)"
llmslo load "$URL" --rate "$RATE" --duration "${LOAD_S}s" --burst 3x@30s+20s --prompt-tokens 50-400 \
  --output-tokens "${OUTPUT_TOKENS:-64-256}" --cancel 0.05@3s --timeout 120s --seed 7 --db client.duckdb \
  --goodput 'ttft:1000 tpot:50' --no-progress --json > "$OUT/load.json" 2>> "$OUT/run.log"
log "load done: $(head -c 300 "$OUT/load.json")"
sleep 3
wait "$SAMPLER"; SAMPLER=
cat sampler.log | tee -a "$OUT/run.log"
kill -TERM "$SERVER"
for _ in $(seq 1 60); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.5; done
kill -KILL "$SERVER" 2>/dev/null; wait "$SERVER"; SERVER=
tail -5 server.log | tee -a "$OUT/run.log"

run llmslo ingest server/*.jsonl --db run.duckdb
run llmslo report --db run.duckdb --by tenant_class
run llmslo report --db client.duckdb
run llmslo gpu correlate --db run.duckdb --bucket 1s
llmslo gpu correlate --db run.duckdb --bucket 1s --json > "$OUT/correlate.json" 2>> "$OUT/run.log"
run $PY - <<'PY'
import duckdb
con = duckdb.connect("run.duckdb", read_only=True)
con.execute("ATTACH 'client.duckdb' AS c (READ_ONLY)")
q = """SELECT count(*), sum(s.generated_tokens), sum(k.generated_tokens), sum(s.prompt_tokens),
              count(*) FILTER (WHERE s.finish_reason = k.finish_reason)
       FROM request_summaries s JOIN c.request_summaries k USING (request_id)"""
n, gen_s, gen_c, prompt_s, same = con.execute(q).fetchone()
print(f"client/server join on request_id: {n} requests; generated tokens server {gen_s} vs client {gen_c}; "
      f"prompt tokens (server) {prompt_s}; same finish reason {same} of {n}")
tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
if "gpu_samples" in tables:
    g = con.execute("SELECT count(*), min(util_gpu_pct), median(util_gpu_pct), max(util_gpu_pct), "
                    "max(memory_used_bytes) / 2^30, max(power_w) FROM gpu_samples").fetchone()
    print(f"gpu_samples: {g[0]} rows; GPU utilisation min {g[1]} median {g[2]} max {g[3]} %; "
          f"memory used at most {g[4]:.1f} GiB; power at most {g[5]} W")
else:
    print("gpu_samples: none (no NVML here)")
PY
cp run.duckdb client.duckdb "$OUT"/ 2>/dev/null
cp server.log "$OUT"/ 2>/dev/null
log "done: $(ls "$OUT" | tr '\n' ' ')"
