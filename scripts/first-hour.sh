#!/usr/bin/env bash
# A new user's first hour, scripted, on this machine: `cascade up` (real processes on free
# loopback ports), the README's curl commands as the README writes them, the official openai
# client, `cascade generate`, lm-eval with the gateway's tokenizer (README), the playground in
# Chromium. Each step prints PASS, FAIL or SKIP (with why) and its time; the exit status is 1 if
# any step failed. The cluster is always stopped. Slow: a minute or two (the real SmolLM2 pair
# on CPU; lm-eval is skipped, saying so, unless `pip install -e '.[eval]'` installed it).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cascade-first-hour.XXXXXX")
export COLUMNS=200  # `cascade up` prints its addresses on one line each
FAILED=0
UP_PID=

report() {  # report STATUS STEP START_S [WHY]
  printf '%-4s  %-40s %6.1f s  %s\n' "$1" "$2" \
    "$(awk -v now="$(date +%s.%N)" -v then="$3" 'BEGIN { print now - then }')" "${4:-}"
  [ "$1" = FAIL ] && FAILED=1
  return 0
}

step() {  # step NAME COMMAND...: run it with its output in $WORK/NAME.log, then report
  local name=$1 start; shift
  start=$(date +%s.%N)
  if "$@" >"$WORK/$name.log" 2>&1; then
    report PASS "$name" "$start" "$(tail -n 1 "$WORK/$name.log" | cut -c1-110)"
  else
    report FAIL "$name" "$start" "see below"
    tail -n 25 "$WORK/$name.log" | sed 's/^/      | /'
  fi
}

is_running() {  # a zombie has exited
  local state; state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state:0:1}" != Z ]
}

stop_cluster() {
  [ -n "$UP_PID" ] || return 0
  local start; start=$(date +%s.%N)
  kill -INT "$UP_PID" 2>/dev/null  # what Ctrl-C sends: `cascade up` stops everything it started
  for _ in $(seq 180); do is_running "$UP_PID" || break; sleep 0.5; done
  is_running "$UP_PID" && kill -TERM -- -"$UP_PID" 2>/dev/null  # it hung: 90 s is plenty
  wait "$UP_PID" 2>/dev/null
  sleep 1
  local left; left=$(pgrep -g "$UP_PID" | tr '\n' ' ')
  if [ -z "$left" ]; then
    report PASS "stop (Ctrl-C to cascade up)" "$start" "every process it started exited"
  else
    report FAIL "stop (Ctrl-C to cascade up)" "$start" "still running: $left (killed now)"
    kill -TERM -- -"$UP_PID" 2>/dev/null
  fi
  UP_PID=
}
trap 'stop_cluster; echo "logs: $WORK"; exit $FAILED' EXIT
trap 'echo "interrupted"; FAILED=1; exit' INT TERM

echo "cascade first hour: logs in $WORK"
start=$(date +%s.%N)
# Job control on: the background `cascade up` then takes Ctrl-C (SIGINT) as in a terminal, and
# leads a process group of its own, so stop_cluster can tell whether anything of it is left.
set -m
(cd "$WORK" && exec "$ROOT/.venv/bin/cascade" up --port 0 --grpc-port 0) >"$WORK/up.log" 2>&1 &
UP_PID=$!
set +m
for _ in $(seq 600); do  # it prints this line once the whole cluster is ready
  grep -q "Ctrl-C stops the cluster" "$WORK/up.log" || ! is_running "$UP_PID" && break
  sleep 1
done
HTTP_URL=$(grep -o 'gateway: http://[0-9.:]*' "$WORK/up.log" | cut -d' ' -f2)
GRPC=$(grep -o 'gRPC [0-9.:]*' "$WORK/up.log" | cut -d' ' -f2)
if [ -z "$HTTP_URL" ] || [ -z "$GRPC" ]; then
  report FAIL "cascade up --port 0 --grpc-port 0" "$start" "no gateway came up"
  tail -n 25 "$WORK/up.log" | sed 's/^/      | /'
  exit 1
fi
report PASS "cascade up --port 0 --grpc-port 0" "$start" "gateway $HTTP_URL, gRPC $GRPC"

readme_curl() {
  local commands answer
  commands=$("$PY" scripts/first_hour.py readme-commands curl "$HTTP_URL") || return 1
  printf '%s\n' "$commands"
  answer=$(bash -c "set -eo pipefail; $commands") || return 1
  printf '%s\n' "$answer"
  "$PY" scripts/first_hour.py check-completion <<<"$answer"
}
step "README curl commands" readme_curl
MODEL=$(curl -s "$HTTP_URL/v1/models" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
export MODEL  # the README's lm-eval command names it

step "openai client: completion, chat, stream" \
  "$PY" scripts/first_hour.py openai "$HTTP_URL" "$MODEL"

cascade_generate() {
  local out
  out=$("$ROOT/.venv/bin/cascade" generate --gateway "$GRPC" --max-tokens 16 "import os") ||
    return 1
  printf '%s\n' "$out"
  grep -q "identical output: True" <<<"$out" &&  # greedy: speculative text = the target's
    grep -o "speedup over target-only: [0-9.]*x" <<<"$out"
}
step "cascade generate" cascade_generate

readme_lm_eval() {
  local commands
  commands=$("$PY" scripts/first_hour.py readme-commands lm-eval "$HTTP_URL") || return 1
  commands=${commands//runs\/lm-eval/$WORK/lm-eval}
  printf '%s\n' "$commands"
  # The tasks' data are local files: nothing to fetch, so no hub is asked (none may be there).
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 bash -c "set -eo pipefail; $commands" &&
    "$PY" scripts/lm_eval_check.py "$HTTP_URL" "$WORK/lm-eval"
}
start=$(date +%s.%N)
if "$PY" -c 'import lm_eval' 2>/dev/null; then
  step "lm-eval, remote tokenizer (README)" readme_lm_eval
else
  report SKIP "lm-eval, remote tokenizer (README)" "$start" \
    "lm-eval is not installed: .venv/bin/pip install -e '.[eval]'"
fi

start=$(date +%s.%N)
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  step "playground in Chromium" "$PY" scripts/first_hour.py playground "$HTTP_URL" \
    "$WORK/playground.png"
else
  report SKIP "playground in Chromium" "$start" "no chromium executable (apt-get install chromium)"
fi
