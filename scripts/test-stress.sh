#!/usr/bin/env bash
# A flake hunt: runs the timing-sensitive integration test files ROUNDS times while every core is
# kept busy by a busy loop, then prints each test that failed with its failures/rounds and exits 1
# if any test failed in any round. `make test-stress` runs it; it is not part of `make test`.
#
#   ROUNDS=10            how many times each test file runs (default 10)
#   TESTS="lease wake"   the test files (names under tests/, fredlock-cli/tests/ or
#                        fredlock-testkit/tests/; default: the list below)
#   FILTER=release_by    a libtest name filter passed to every test binary (default: all tests)
#   LOAD=2               busy loops beside the tests (default: one per core; 0: none)
#   TIMEOUT=900          seconds before a test binary counts as hung and is killed
#   FREDLOCK_SERVER=valkey  nodes on valkey-server (fetched once by scripts/valkey-server.sh)
#
# The test binaries are built once (cargo test --no-run) and then run directly, one file at a
# time as `cargo test` does, each from its package's directory. Logs of every run are kept under
# target/stress/ and the first lines of each failure are printed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

ROUNDS="${ROUNDS:-10}"
FILTER="${FILTER:-}"
TIMEOUT="${TIMEOUT:-900}"
cores="$(getconf _NPROCESSORS_ONLN 2>/dev/null || nproc 2>/dev/null || echo 2)"
LOAD="${LOAD:-$cores}"
CARGO="${CARGO:-cargo}"
# What waits for events, faults nodes, keeps locks alive, hands over or counts on a deadline.
# Left out to keep a round near 3 minutes: the torture runs (minutes, and their own stress), the
# command's tests (cli, newcomer, handoff, elect: 1 minute; add them with TESTS), the property,
# input and layout tests, and tests without waits (owner, errors, mutex, duplicates, many_locks).
DEFAULT_TESTS="sentinel replicas lease hold_at_least lua_free lifecycle faults keepalive keepalive_batch
  keepalive_budget wake handover line_handover line_order election leader observe fencing batch
  line_restart semaphore rwlock metrics credentials quorum cluster_nodes heal fencing_restart
  node_status"
TESTS="${TESTS:-$DEFAULT_TESTS}"

case "$ROUNDS" in '' | *[!0-9]*) echo "ROUNDS must be a number, not '$ROUNDS'" >&2; exit 64 ;; esac
case "$LOAD" in '' | *[!0-9]*) echo "LOAD must be a number, not '$LOAD'" >&2; exit 64 ;; esac

# Which package each file belongs to (the first of tests/, fredlock-cli/tests/,
# fredlock-testkit/tests/ that has it).
package_of() {
  local dir
  for dir in . fredlock-cli fredlock-testkit; do
    if [ -f "$dir/tests/$1.rs" ]; then echo "$dir"; return 0; fi
  done
  return 1
}

declare -a files=() dirs=()
for t in $TESTS; do
  dir="$(package_of "$t")" || { echo "no test file named '$t'" >&2; exit 64; }
  files+=("$t")
  dirs+=("$dir")
done

if [ "${FREDLOCK_SERVER:-redis}" = valkey ]; then
  bash scripts/valkey-server.sh >/dev/null || exit 1
fi

# Build once, quietly; take each test binary's path from cargo's JSON messages.
echo "building ${#files[@]} test binaries ..." >&2
declare -A exe=()
for dir in . fredlock-cli fredlock-testkit; do
  args=()
  for i in "${!files[@]}"; do
    [ "${dirs[$i]}" = "$dir" ] && args+=(--test "${files[$i]}")
  done
  [ ${#args[@]} -eq 0 ] && continue
  json="$(cd "$dir" && "$CARGO" test --all-features --no-run --message-format=json "${args[@]}")" \
    || { echo "the build failed (cargo test --no-run in $dir)" >&2; exit 1; }
  while IFS= read -r path; do
    name="$(basename "$path")"
    exe["${name%-*}"]="$path"
  done < <(printf '%s\n' "$json" | grep '"kind":\["test"\]' \
    | grep -o '"executable":"[^"]*"' | sed 's/^"executable":"//; s/"$//')
done
for t in "${files[@]}"; do
  [ -n "${exe[$t]:-}" ] || { echo "cargo built no binary for '$t'" >&2; exit 1; }
done

logs="$root/target/stress/$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$logs"
failures="$logs/failures"
: >"$failures"

# The table: each failing test with its failures over the rounds run (all of them, or those
# begun before an interrupt). Returns 1 if any test failed.
summary() {
  local rounds="$1" total=$(($(date +%s) - started)) line round name file test
  echo
  echo "$rounds rounds of ${#files[@]} test files in ${total} s ($((total / (rounds > 0 ? rounds : 1))) s a round), $LOAD busy loops on $cores cores, ${FREDLOCK_SERVER:-redis} nodes"
  # The slowest files (mean seconds a round): what to leave out when a round takes too long.
  echo "slowest files (mean s a round): $(awk '{s[$1] += $2; n[$1]++} END {for (f in s) printf "%s %d\n", f, s[f] / n[f]}' \
    "$logs/seconds" 2>/dev/null | sort -k2 -rn | head -8 | awk '{printf "%s %s, ", $1, $2}' | sed 's/, $//')"
  if [ ! -s "$failures" ]; then
    echo "no failures"
    return 0
  fi
  printf '%-78s %s\n' "test" "failures/rounds"
  sed 's/ [0-9]*$//' "$failures" | sort | uniq -c | sort -rn \
    | while read -r count name; do printf '%-78s %s/%s\n' "$name" "$count" "$rounds"; done
  echo
  echo "first lines of each failure (full logs in $logs):"
  while read -r line; do
    round="${line##* }"
    name="${line% *}"
    file="${name%%::*}"
    test="${name#*::}"
    echo "--- $name (round $round)"
    # The panic's place and message: the block's lines up to the backtrace, blank ones skipped.
    grep -A8 -F -- "---- $test stdout ----" "$logs/round-$round-$file.log" | sed '1d; /^stack backtrace:/,$d; /^$/d' \
      | head -4 | cut -c1-400 | sed 's/^/    /'
  done <"$failures"
  return 1
}


# The load: one busy loop per core, each also ending by itself once this script is gone (even
# after a kill -9, when no trap runs); the trap kills them on every exit.
load_pids=()
cleanup() {
  local pid
  for pid in "${load_pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
}
trap cleanup EXIT
# Interrupted (Ctrl-C): the table of the rounds begun so far, then exit 130.
round=0
started=$(date +%s)
trap 'trap - INT; echo; echo "interrupted in round $round"; summary "$round"; exit 130' INT
trap 'exit 143' TERM
me=$$
for _ in $(seq 1 "$LOAD"); do
  # shellcheck disable=SC2016
  sh -c 'while kill -0 "$1" 2>/dev/null; do i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; done' \
    sh "$me" &
  load_pids+=($!)
done
echo "load: $LOAD busy loops on $cores cores; server: ${FREDLOCK_SERVER:-redis}; logs: $logs" >&2

for round in $(seq 1 "$ROUNDS"); do
  round_start=$(date +%s)
  round_failed=0
  for i in "${!files[@]}"; do
    t="${files[$i]}"
    log="$logs/round-$round-$t.log"
    file_start=$(date +%s)
    # shellcheck disable=SC2086
    (cd "${dirs[$i]}" && timeout --kill-after=10 "$TIMEOUT" "${exe[$t]}" $FILTER) >"$log" 2>&1
    rc=$?
    echo "$t $(($(date +%s) - file_start))" >>"$logs/seconds"
    failed="$(grep -E '^test .* \.\.\. FAILED$' "$log" | sed 's/^test \(.*\) \.\.\. FAILED$/\1/')"
    if [ -n "$failed" ]; then
      printf '%s\n' "$failed" | sed "s|^|$t::|; s|\$| $round|" >>"$failures"
    elif [ $rc -ne 0 ]; then
      # No test failed by name: a hang (libtest names those running for over 60 s) or a crash.
      hung="$(grep -o 'test .* has been running for over' "$log" | sed 's/^test //; s/ has been.*//')"
      if [ $rc -ge 124 ] && [ -n "$hung" ]; then
        printf '%s\n' "$hung" | sed "s|^|$t::|; s|\$| (hung) $round|" >>"$failures"
      else
        echo "$t::(binary exit $rc) $round" >>"$failures"
      fi
    fi
    [ $rc -ne 0 ] && round_failed=$((round_failed + 1)) && echo "  round $round: $t failed (log: $log)" >&2
  done
  echo "round $round/$ROUNDS: $(($(date +%s) - round_start)) s, $round_failed file(s) failed," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >&2
done
summary "$ROUNDS"
exit $?
