#!/usr/bin/env bash
# make bench-pgbench: transaction throughput and added latency, side by side in
# one run: direct Postgres, PgBouncer and one or more pgtender binaries (so two
# builds, e.g. before and after a change, are compared in the same run).
#
# One `pgbench -i -s 1` (direct) first. Then each round starts every pooler
# (fresh processes, each on its own port), warms each target up (a short
# unrecorded pgbench), and for each -M mode and client count runs
#   pgbench -n -S -M <mode> -c <n> -j 2 -T <duration>
# against every target in turn, so drift on a shared machine hits all alike;
# the order of the targets rotates by one each round. The poolers are stopped
# at the end of each round and started again for the next.
#
# A pgbench that fails (exit non-zero: -M prepared through a transaction-mode
# pooler without prepared-statement support aborts its clients) does not stop
# the script: the cell is kept with status "failed", what pgbench printed, and
# its failed-transaction count.
#
# Output, under .sandbox/bench/pgbench-<timestamp>/:
#   results.tsv     one line per cell and round, failed cells included:
#                   round target mode clients tps latency_ms failed status exit
#                   aborted xacts load1 cpu_us_per_xact
#                   (failed = pgbench's "number of failed transactions";
#                   status = ok | failed; aborted = clients pgbench reports
#                   aborted; load1 = 1-minute load average at the cell's start;
#                   cpu_us_per_xact = the pooler process's utime+stime over the
#                   cell per transaction, "-" for direct)
#   conditions.txt  commit, binaries, versions, configs in brief, uptime and
#                   the busiest processes before and after
#   table.md        the Markdown table printed at the end (pgbench-table.py)
#   logs/           every pgbench's output; cfg/ the configs; pooler logs
#
# Environment (defaults in brackets):
#   PGTENDER_BINS ["pgtender=bin/pgtender", built by `make build`]
#                 space-separated label=path; labels [A-Za-z0-9_-], not
#                 "direct" or "pgbouncer". When set, nothing is built.
#   ROUNDS [3]  MODES ["simple extended prepared"]  CLIENTS ["1 32"]
#   DURATION [10] seconds per cell   THREADS [2] pgbench -j
#   WARMUP [2] seconds of unrecorded pgbench per target and round (0 = none)
#   POOL_SIZE [20]   SCALE [1] pgbench -i -s
#   PGB_PORT [6533]  PGT_PORT [6541] the first pgtender's port; the next ones
#                    count up from it
# Needs root (PgBouncer runs as the postgres user). Uses the sandbox PostgreSQL
# (deploy/sandbox.sh start; reused if it already runs) on 127.0.0.1:5432, role
# and database pgtender, and leaves it running. Loopback only.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
MODES=${MODES:-"simple extended prepared"}
CLIENTS=${CLIENTS:-"1 32"}
DURATION=${DURATION:-10}
DURATION=${DURATION%s}
THREADS=${THREADS:-2}
WARMUP=${WARMUP:-2}
WARMUP=${WARMUP%s}
POOL_SIZE=${POOL_SIZE:-20}
SCALE=${SCALE:-1}
PGB_PORT=${PGB_PORT:-6533}
PGT_PORT=${PGT_PORT:-6541}
PG_HOST=127.0.0.1 PG_PORT=5432 PG_USER=pgtender PG_DB=pgtender
export PGPASSWORD=pgtender PGSSLMODE=disable

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
say() { printf 'bench-pgbench: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=deploy/bench/lib.sh
source "$repo/deploy/bench/lib.sh"

[[ $EUID -eq 0 ]] || die "must run as root (pgbouncer as the postgres user, its fd limit raised)"
for v in ROUNDS DURATION THREADS WARMUP POOL_SIZE SCALE PGB_PORT PGT_PORT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v=${!v} is not a whole number"
done
(( ROUNDS >= 1 && DURATION >= 1 )) || die "ROUNDS and DURATION must be at least 1"
for m in $MODES; do
  [[ $m == simple || $m == extended || $m == prepared ]] || die "MODES: $m is not simple, extended or prepared"
done
for c in $CLIENTS; do [[ $c =~ ^[1-9][0-9]*$ ]] || die "CLIENTS: $c is not a client count"; done

# --- prerequisites ----------------------------------------------------------
command -v pgbench >/dev/null || die "pgbench not found; install postgresql-client (Debian: apt-get install postgresql-client)"
command -v python3 >/dev/null || die "python3 not found (it prints the table)"
ensure_pgbouncer

# --- targets ------------------------------------------------------------------
# pgt_labels[i], pgt_bins[i], pgt_ports[i]: the pgtender binaries to measure.
pgt_labels=() pgt_bins=() pgt_ports=()
if [[ -z ${PGTENDER_BINS:-} ]]; then
  make --no-print-directory build >&2
  PGTENDER_BINS="pgtender=$repo/bin/pgtender"
fi
for spec in $PGTENDER_BINS; do
  [[ $spec == *=* ]] || die "PGTENDER_BINS: '$spec' is not label=path"
  label=${spec%%=*} bin=${spec#*=}
  [[ $label =~ ^[A-Za-z0-9_-]+$ ]] || die "PGTENDER_BINS: label '$label' must be letters, digits, - or _"
  [[ $label != direct && $label != pgbouncer ]] || die "PGTENDER_BINS: label '$label' is taken"
  for l in "${pgt_labels[@]}"; do [[ $l != "$label" ]] || die "PGTENDER_BINS: label '$label' given twice"; done
  [[ $bin == /* ]] || bin=$repo/$bin
  [[ -x $bin ]] || die "PGTENDER_BINS: $bin (for $label) is not an executable file"
  pgt_ports+=($(( PGT_PORT + ${#pgt_labels[@]} )))
  pgt_labels+=("$label") pgt_bins+=("$bin")
done
(( ${#pgt_labels[@]} > 0 )) || die "PGTENDER_BINS is empty"
targets=(direct pgbouncer "${pgt_labels[@]}")

port_of() { # target
  case $1 in
    direct) echo "$PG_PORT" ;;
    pgbouncer) echo "$PGB_PORT" ;;
    *) local i; for i in "${!pgt_labels[@]}"; do if [[ ${pgt_labels[$i]} == "$1" ]]; then echo "${pgt_ports[$i]}"; fi; done ;;
  esac
}

# --- results --------------------------------------------------------------
results_dir pgbench
raw=$out/results.tsv
printf 'round\ttarget\tmode\tclients\ttps\tlatency_ms\tfailed\tstatus\texit\taborted\txacts\tload1\tcpu_us_per_xact\n' >"$raw"
say "results in $out"

# --- the poolers --------------------------------------------------------------
declare -A pid_of=()
stop_pooler() { # target
  stop_pid "${pid_of[$1]:-}"
  pid_of[$1]=""
}
stop_poolers() {
  local t
  for t in "${targets[@]}"; do [[ $t == direct ]] || stop_pooler "$t"; done
}
cleanup() {
  trap - EXIT INT TERM
  stop_poolers
  # The sandbox PostgreSQL is left running (deploy/sandbox.sh stop stops it).
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_pooler() { # target
  local t=$1 port pid
  port=$(port_of "$t")
  stop_pooler "$t"
  port_open "$port" && die "port $port (for $t) is already in use by something else (ss -ltnp 'sport = :$port'); set PGB_PORT / PGT_PORT"
  if [[ $t == pgbouncer ]]; then
    launch_pgbouncer "$cfg/pgbouncer.ini" "$out/pgbouncer.log"
  else
    local i bin
    for i in "${!pgt_labels[@]}"; do if [[ ${pgt_labels[$i]} == "$t" ]]; then bin=${pgt_bins[$i]}; fi; done
    launch_pgtender "$bin" "$cfg/$t" "$out/pgtender-$t.log"
  fi
  pid=$launched_pid
  pid_of[$t]=$pid
  wait_port "$port" || { tail -n 20 "$out"/*"$t".log >&2 || true; die "$t did not listen on $port"; }
  sleep 0.3
  kill -0 "$pid" 2>/dev/null || die "$t exited right after starting (see $out/)"
  say "$t up (pid $pid, port $port, fd limit $(awk '/open files/ {print $4}' "/proc/$pid/limits"))"
}

# --- PostgreSQL ----------------------------------------------------------------
use_postgres "$PG_HOST" "$PG_PORT" "$PG_USER" "$PG_DB"
say "$pg_note"
say "pgbench -i -s $SCALE (direct)"
pgbench -i -s "$SCALE" -q -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" "$PG_DB" >"$logs/init.log" 2>&1 \
  || { cat "$logs/init.log" >&2; die "pgbench -i failed"; }

# No listen_backlog and max_client_conn 1000: pgbench opens at most CLIENTS connections.
write_pgbouncer_ini "$cfg" "$PGB_PORT" "$POOL_SIZE" 1000 "" "$PG_PORT" "$PG_DB" "$PG_USER" "$PGPASSWORD"
for i in "${!pgt_labels[@]}"; do
  write_pgtender_toml "$cfg/${pgt_labels[$i]}" "${pgt_ports[$i]}" "$POOL_SIZE" 2 "" enabled_plain 0 "$PG_PORT" "$PG_DB" "$PG_USER" "$PGPASSWORD"
  "${pgt_bins[$i]}" --config "$cfg/${pgt_labels[$i]}/pgdog.toml" --users "$cfg/${pgt_labels[$i]}/users.toml" --check-config >"$logs/check-${pgt_labels[$i]}.log" 2>&1 \
    || { cat "$logs/check-${pgt_labels[$i]}.log" >&2; die "${pgt_labels[$i]} (${pgt_bins[$i]}) rejects its config"; }
done
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# --- conditions -----------------------------------------------------------------
{
  echo "commit $(git rev-parse --short HEAD) ($(git rev-parse --abbrev-ref HEAD))$(git diff --quiet HEAD -- || echo ' (dirty work tree)')"
  echo "date $(date -u +%FT%TZ)  rounds $ROUNDS  modes $MODES  clients $CLIENTS  duration ${DURATION}s  -j $THREADS  warm-up ${WARMUP}s  pool $POOL_SIZE  scale $SCALE"
  echo "poolers: started at the start of each round, stopped at its end; targets in turn per cell, order rotated by one each round"
  for i in "${!pgt_labels[@]}"; do
    echo "pgtender ${pgt_labels[$i]}: ${pgt_bins[$i]} (port ${pgt_ports[$i]}, sha256 $(sha256sum "${pgt_bins[$i]}" | cut -c1-12), $(stat -c %y "${pgt_bins[$i]}" | cut -d. -f1), '$("${pgt_bins[$i]}" -version 2>&1 | head -1)')"
  done
  echo "pgtender config: transaction mode, workers = 2, default_pool_size = $POOL_SIZE, passthrough enabled_plain, idle_timeout = 0, connection logging off, no metrics endpoint"
  echo "pgbouncer: $(pgbouncer --version | head -1) (port $PGB_PORT): transaction mode, auth_type plain + userlist, default_pool_size = $POOL_SIZE, max_client_conn 1000, server_idle_timeout 0, logging off, fd limit raised"
  echo "$(pgbench --version)  server: $(psql -X -At -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" -c 'SHOW server_version' 2>/dev/null) (fsync $(psql -X -At -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" -c 'SHOW fsync' 2>/dev/null), max_connections $(psql -X -At -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" -c 'SHOW max_connections' 2>/dev/null))"
  echo "postgres: $pg_note"
  echo "nproc $(nproc)  uptime before: $(uptime)"
  echo "busiest processes before (top, 1 s):"
  busiest
} | tee "$out/conditions.txt" >&2

# --- the runs -----------------------------------------------------------------
# run_pgbench TARGET MODE CLIENTS SECONDS LOG: prints "rc"; pgbench's output in LOG.
run_pgbench() {
  local rc=0
  # timeout: a pooler that stops answering costs one cell, not the run (exit 124).
  timeout -k 5 $(( $4 + 60 )) pgbench -n -S -M "$2" -c "$3" -j "$THREADS" -T "$4" \
    -h 127.0.0.1 -p "$(port_of "$1")" -U "$PG_USER" "$PG_DB" >"$5" 2>&1 || rc=$?
  echo "$rc"
}

# run_cell ROUND TARGET MODE CLIENTS: one recorded pgbench, one line in results.tsv.
run_cell() {
  local round=$1 t=$2 mode=$3 n=$4 log pid="" c0=0 c1 load1 rc tps lat failed aborted xacts status cpu="-"
  log=$logs/r$round-$t-$mode-c$n.log
  if [[ $t != direct ]]; then
    pid=${pid_of[$t]:-}
    if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then
      echo "round $round: $t was not running (died?) before -M $mode -c $n; started again" | tee -a "$out/conditions.txt" >&2
      start_pooler "$t"; pid=${pid_of[$t]}
    fi
    c0=$(cpu_us "$pid")
  fi
  load1=$(cut -d' ' -f1 /proc/loadavg)
  rc=$(run_pgbench "$t" "$mode" "$n" "$DURATION" "$log")
  if [[ -n $pid ]]; then c1=$(cpu_us "$pid"); fi
  tps=$(awk '/^tps = / {print $3; exit}' "$log")
  lat=$(awk '/^latency average = / {print $4; exit}' "$log")
  failed=$(awk -F'[: ]+' '/^number of failed transactions/ {print $5; exit}' "$log")
  xacts=$(awk -F': ' '/^number of transactions actually processed/ {split($2, a, "/"); print a[1]; exit}' "$log")
  aborted=$(grep -c 'client [0-9]* script [0-9]* aborted' "$log" || true)
  status=ok
  [[ $rc -eq 0 && -n $tps ]] || status=failed
  if [[ -n $pid && -n $xacts && $xacts -gt 0 ]]; then cpu=$(( (c1 - c0) / xacts )); fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$t" "$mode" "$n" \
    "${tps:--}" "${lat:--}" "${failed:--}" "$status" "$rc" "$aborted" "${xacts:--}" "$load1" "$cpu" >>"$raw"
  if [[ $status == ok ]]; then
    say "round $round $t -M $mode -c $n: $tps tps, $lat ms, $failed failed (load $load1)"
  else
    say "round $round $t -M $mode -c $n: FAILED (exit $rc, $aborted clients aborted, ${failed:--} failed tx): $(grep -m1 -E 'error|FATAL|timeout' "$log" | cut -c1-160)"
  fi
}

for round in $(seq "$ROUNDS"); do
  for t in "${targets[@]}"; do [[ $t == direct ]] || start_pooler "$t"; done
  # This round's order: the targets rotated by round-1.
  k=$(( (round - 1) % ${#targets[@]} ))
  order=("${targets[@]:$k}" "${targets[@]:0:$k}")
  echo "round $round order: ${order[*]}" >>"$out/conditions.txt"
  if (( WARMUP > 0 )); then
    max_c=$(tr ' ' '\n' <<<"$CLIENTS" | sort -n | tail -1)
    for t in "${order[@]}"; do
      run_pgbench "$t" simple "$max_c" "$WARMUP" "$logs/r$round-$t-warmup.log" >/dev/null
    done
  fi
  for mode in $MODES; do
    for n in $CLIENTS; do
      for t in "${order[@]}"; do
        run_cell "$round" "$t" "$mode" "$n"
      done
    done
  done
  stop_poolers
done

{
  echo "uptime after: $(uptime)"
  echo "busiest processes after (top, 1 s):"
  busiest
} | tee -a "$out/conditions.txt" >&2

python3 "$repo/deploy/bench/pgbench-table.py" "$raw" "$out/conditions.txt" "${targets[@]}" | tee "$out/table.md"
say "raw results: $raw"
say "table: $out/table.md"
