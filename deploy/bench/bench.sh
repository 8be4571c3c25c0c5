#!/usr/bin/env bash
# make bench: pgtender, PgBouncer and direct Postgres side by side in one run,
# with the loopback ceiling as calibration (../shared/BENCHMARKS.md, issue 16).
#
# Every row runs once per round, ROUNDS rounds; within a row the targets take
# turns and their order rotates by one each round, so drift on a shared
# machine hits all alike. The rows, per round:
#   login     loginstorm closed loop, 64 workers, SELECT 1, RST close:
#             logins/s, p99, errors, pooler CPU (utime+stime) per login;
#             pgtender, PgBouncer, direct (SCRAM, a fork per login)
#   sweep     the same at SWEEP workers (64 256 1024 4096): logins/s, p99,
#             max, errors; pgtender and PgBouncer
#   pgbench   `pgbench -n [-S] -M simple|extended|prepared -c N -T s` for
#             PGBENCH_CELLS (S:1 S:32 S:256 tpcb:32): tps, latency, failed,
#             pooler CPU per transaction; direct, PgBouncer, pgtender. A
#             pgbench that fails is kept as "failed". Direct is skipped where
#             the clients exceed Postgres's max_connections less 40.
#   rotation  pgtender under passthrough_auth = "enabled_plain_allow_change"
#             (its own instance, a fresh one each round): 64 workers log in
#             as role bench_rotation with password A, then switch to B
#             halfway (loginstorm -passwords A,B -password-switch-after);
#             ALTER ROLE ... PASSWORD 'B' runs a quarter of the way in.
#             PgBouncer has no equivalent (auth_type plain checks its
#             userlist, one password per user, changed only by rewriting the
#             file and RELOAD), so it is not run there.
#   idle      RSS per idle logged-in client: a fresh pooler, 1 s of logins to
#             warm it, VmRSS; then loginstorm -hold IDLE_CLIENTS, VmRSS
#             IDLE_SETTLE s after all are held; (held - before) / clients
#   pinned    (PINNED=1) each pooler pinned to CPU 0 (taskset; pgtender with
#             GOMAXPROCS=1 and workers = 1), loginstorm, pgbench and every
#             Postgres process on CPU 1 (restored afterwards): the login row
#             (the ceiling too, pinned alike) and pgbench -S -c 32 simple
# Calibration: the loopback ceiling (bin/loginceiling, cmd/loginceiling: a
# login server with no backend) under the login row's loginstorm, before the
# first round and after the last.
#
# Output, under .sandbox/bench/bench-<UTC timestamp>/:
#   report.md         the tables: medians of the rounds, each round's value,
#                     failed trials kept (deploy/bench/bench-report.py)
#   report.json       every raw measurement (loginstorm's JSON, pgbench's
#                     figures and output), the conditions and the configs
#   measurements.tsv  one line per measurement, as the script recorded it
#   conditions.txt    commit, binaries, versions, configs in brief, load and
#                     the busiest processes at the start and the end
#   cfg/ logs/        the configs; every loginstorm and pgbench output and
#                     the poolers' logs
#
# Environment (defaults in brackets; BENCH_QUICK=1 in braces):
#   BENCH_QUICK [0]           1: a run under 2 minutes, every row kind in it
#   ROUNDS [3] {1}            LOGIN_SECONDS [5] {2}   CALIB_SECONDS [5] {2}
#   SWEEP ["64 256 1024 4096"] {"64 1024"}            SWEEP_SECONDS [3] {2}
#   PGBENCH_CELLS ["S:1 S:32 S:256 tpcb:32"] {"S:1 S:32 tpcb:32"}
#   MODES ["simple extended prepared"]   PGBENCH_SECONDS [3] {1}
#   PGBENCH_WARMUP [1] {0} seconds of unrecorded pgbench -S -c 32 per target
#   ROTATION_SECONDS [6] {3}  IDLE_CLIENTS [10000] {2000}  PINNED [1]
#   IDLE_SETTLE [3] seconds the idle clients are held before RSS is read:
#                   past two of pgtender's 1 s parking sweeps (pooler/park.go)
#   POOL_SIZE [20]  THREADS [2] pgbench -j (at most the clients)
#   PGT_PORT [6561] PGB_PORT [6562] ROT_PORT [6563] CEIL_PORT [6564]
#   METRICS_PORT [9961] pgtender's /metrics (the rotation instance's: one
#                       more), for loginstorm's reconciliation
# Needs root (PgBouncer runs as the postgres user; the rotation role is made
# by the superuser over the sandbox's socket; taskset on Postgres). Uses the
# sandbox PostgreSQL (deploy/sandbox.sh start, or the one already on
# 127.0.0.1:5432), role and database pgtender, and leaves it running.
# Loopback only. A row that fails (a pooler that does not start, a pgbench
# that fails) is recorded and the run goes on; the exit status is non-zero
# only when the harness itself broke.
set -euo pipefail

BENCH_QUICK=${BENCH_QUICK:-0}
# pick DEFAULT QUICK: the default, or BENCH_QUICK=1's value.
if [[ $BENCH_QUICK == 1 ]]; then
  pick() { echo "$2"; }
else
  pick() { echo "$1"; }
fi
ROUNDS=${ROUNDS:-$(pick 3 1)}
LOGIN_SECONDS=${LOGIN_SECONDS:-$(pick 5 2)}
CALIB_SECONDS=${CALIB_SECONDS:-$(pick 5 2)}
SWEEP=${SWEEP:-$(pick "64 256 1024 4096" "64 1024")}
SWEEP_SECONDS=${SWEEP_SECONDS:-$(pick 3 2)}
PGBENCH_CELLS=${PGBENCH_CELLS:-$(pick "S:1 S:32 S:256 tpcb:32" "S:1 S:32 tpcb:32")}
MODES=${MODES:-"simple extended prepared"}
PGBENCH_SECONDS=${PGBENCH_SECONDS:-$(pick 3 1)}
PGBENCH_WARMUP=${PGBENCH_WARMUP:-$(pick 1 0)}
ROTATION_SECONDS=${ROTATION_SECONDS:-$(pick 6 3)}
IDLE_CLIENTS=${IDLE_CLIENTS:-$(pick 10000 2000)}
IDLE_SETTLE=${IDLE_SETTLE:-3}
PINNED=${PINNED:-1}
POOL_SIZE=${POOL_SIZE:-20}
THREADS=${THREADS:-2}
PGT_PORT=${PGT_PORT:-6561} PGB_PORT=${PGB_PORT:-6562} ROT_PORT=${ROT_PORT:-6563} CEIL_PORT=${CEIL_PORT:-6564}
METRICS_PORT=${METRICS_PORT:-9961}
ROT_METRICS_PORT=$(( METRICS_PORT + 1 ))
PG_HOST=127.0.0.1 PG_PORT=5432 PG_USER=pgtender PG_DB=pgtender
BACKLOG=4096 MAX_CLIENT_CONN=20000 WORKERS=64
ROT_ROLE=bench_rotation ROT_A=bench-rotation-A ROT_B=bench-rotation-B
# loginstorm reads PGPASSWORD too; every run also gets -password.
export PGPASSWORD=pgtender PGSSLMODE=disable
PYTHON=/usr/bin/python3

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
export PATH=$PATH:/usr/local/go/bin
say() { printf 'bench: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }
# shellcheck source=deploy/bench/lib.sh
source "$repo/deploy/bench/lib.sh"

[[ $EUID -eq 0 ]] || die "must run as root (pgbouncer as the postgres user, the rotation role, taskset on Postgres)"
for v in ROUNDS LOGIN_SECONDS CALIB_SECONDS SWEEP_SECONDS PGBENCH_SECONDS PGBENCH_WARMUP ROTATION_SECONDS \
  IDLE_CLIENTS POOL_SIZE THREADS PGT_PORT PGB_PORT ROT_PORT CEIL_PORT METRICS_PORT; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v=${!v} is not a whole number"
done
(( ROUNDS >= 1 && LOGIN_SECONDS >= 1 && CALIB_SECONDS >= 1 && SWEEP_SECONDS >= 1 && PGBENCH_SECONDS >= 1 )) \
  || die "ROUNDS and the *_SECONDS must be at least 1"
(( ROTATION_SECONDS >= 2 )) || die "ROTATION_SECONDS must be at least 2 (the switch is halfway)"
for n in $SWEEP; do [[ $n =~ ^[1-9][0-9]*$ ]] || die "SWEEP: $n is not a worker count"; done
for m in $MODES; do [[ $m =~ ^(simple|extended|prepared)$ ]] || die "MODES: $m is not simple, extended or prepared"; done
for c in $PGBENCH_CELLS; do [[ $c =~ ^(S|tpcb):[1-9][0-9]*$ ]] || die "PGBENCH_CELLS: $c is not S:<clients> or tpcb:<clients>"; done

# --- prerequisites ----------------------------------------------------------
for tool in pgbench psql taskset setpriv timeout ss curl; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
[[ -x $PYTHON ]] || die "$PYTHON not found (it writes the report)"
ensure_pgbouncer
make --no-print-directory build >&2 || die "make build failed"
go build -o bin/loginceiling ./cmd/loginceiling || die "go build ./cmd/loginceiling failed"
[[ -x bin/loginstorm ]] || die "bin/loginstorm missing after make build"
for p in "$PGT_PORT" "$PGB_PORT" "$ROT_PORT" "$CEIL_PORT" "$METRICS_PORT" "$ROT_METRICS_PORT"; do
  port_open "$p" && die "port $p is already in use (ss -ltnp 'sport = :$p'); set PGT_PORT, PGB_PORT, ROT_PORT, CEIL_PORT or METRICS_PORT"
done

# --- results --------------------------------------------------------------
results_dir bench
tsv=$out/measurements.tsv
printf 'kind\tround\ttarget\tparam\texit\tcpu_us\tload1\trss_before_kib\trss_held_kib\tfds_before\tfds_held\tfile\tnote\n' >"$tsv"
started=$(date +%s)
say "results in $out"

# record KIND ROUND TARGET PARAM EXIT CPU_US LOAD1 RSS0 RSS1 FDS0 FDS1 FILE NOTE
record() {
  local IFS=$'\t'
  echo "$*" >>"$tsv"
}

# --- processes ----------------------------------------------------------------
# pid_of[target]: pgtender, pgbouncer, rotation (pgtender in allow_change
# mode), ceiling. Direct Postgres has none of its own.
declare -A pid_of=()
pinned_run=""   # the CPU the poolers are pinned to in the pinned rows, else empty
gen=()          # the prefix loginstorm and pgbench run under (taskset in the pinned rows)

port_of() {
  case $1 in
    direct) echo "$PG_PORT" ;;
    pgtender) echo "$PGT_PORT" ;;
    pgbouncer) echo "$PGB_PORT" ;;
    rotation) echo "$ROT_PORT" ;;
    ceiling) echo "$CEIL_PORT" ;;
  esac
}
alive() { [[ -n ${pid_of[$1]:-} ]] && kill -0 "${pid_of[$1]}" 2>/dev/null; }

stop_target() {
  stop_pid "${pid_of[$1]:-}"
  pid_of[$1]=""
}

# start_target TARGET: a fresh process (pinned to $pinned_run when set).
# Returns 1, after saying why, when it does not come up.
start_target() {
  local t=$1 port
  port=$(port_of "$t")
  stop_target "$t"
  if port_open "$port"; then
    say "port $port (for $t) is taken by something else"
    return 1
  fi
  case $t in
    pgbouncer) launch_pgbouncer "$cfg/pgbouncer/pgbouncer.ini" "$logs/pgbouncer.log" "$pinned_run" ;;
    pgtender) launch_pgtender "$repo/bin/pgtender" "$cfg/pgtender${pinned_run:+-pinned}" "$logs/pgtender.log" "$pinned_run" ;;
    rotation) launch_pgtender "$repo/bin/pgtender" "$cfg/pgtender-rotation" "$logs/pgtender-rotation.log" ;;
    ceiling)
      local pin=()
      [[ -n $pinned_run ]] && pin=(taskset -c "$pinned_run" env GOMAXPROCS=1)
      "${pin[@]}" bin/loginceiling -addr "127.0.0.1:$CEIL_PORT" >>"$logs/loginceiling.log" 2>&1 &
      launched_pid=$!
      ;;
  esac
  pid_of[$t]=$launched_pid
  if ! wait_port "$port"; then
    say "$t did not listen on $port (see $logs/)"
    stop_target "$t"
    return 1
  fi
  sleep 0.3
  if ! alive "$t"; then
    say "$t exited right after starting (see $logs/)"
    return 1
  fi
  say "$t up (pid ${pid_of[$t]}, port $port${pinned_run:+, pinned to CPU $pinned_run}, fd limit $(awk '/open files/ {print $4}' "/proc/${pid_of[$t]}/limits"))"
}

# ensure_target TARGET: starts it again if it died (noted in conditions.txt).
ensure_target() {
  [[ $1 == direct ]] && return 0
  alive "$1" && return 0
  echo "$(date -u +%T) $1 was not running; started again" >>"$out/conditions.txt"
  start_target "$1"
}

# --- PostgreSQL ----------------------------------------------------------------
use_postgres "$PG_HOST" "$PG_PORT" "$PG_USER" "$PG_DB"
say "$pg_note"
pg_setting() { timeout 30 psql -X -At -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" -c "SHOW $1" 2>/dev/null || echo "?"; }
max_conn=$(pg_setting max_connections)
# The postmaster (whatever started it) and the superuser's socket: the
# rotation role and the pinned rows need them.
postmaster=$(ss -Hltnp "sport = :$PG_PORT" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2 || true)
[[ -n $postmaster ]] || die "no process listens on $PG_PORT"
pg_datadir=$(readlink "/proc/$postmaster/cwd")
pg_socket=$(sed -n 5p "$pg_datadir/postmaster.pid" 2>/dev/null || true)
superuser_psql() {
  timeout 30 runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -h "$pg_socket" -p "$PG_PORT" -U postgres -d postgres "$@"
}
rotation_ok=1
if ! superuser_psql >"$logs/rotation-role.log" 2>&1 <<EOF
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$ROT_ROLE') AS create_role \gset
\if :create_role
CREATE ROLE $ROT_ROLE LOGIN;
\endif
SET password_encryption = 'scram-sha-256';
ALTER ROLE $ROT_ROLE LOGIN PASSWORD '$ROT_A';
EOF
then
  rotation_ok=0
  say "cannot make role $ROT_ROLE as the superuser over $pg_socket (see $logs/rotation-role.log): the rotation row is skipped"
fi

say "pgbench -i -s 1 (direct)"
timeout 120 pgbench -i -s 1 -q -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" "$PG_DB" >"$logs/pgbench-init.log" 2>&1 \
  || { cat "$logs/pgbench-init.log" >&2; die "pgbench -i failed"; }

# pin_postgres CPU / unpin_postgres: every process of the cluster (the
# postmaster, so the backends it forks inherit it, and those running now).
pg_mask=""
pg_pids() { echo "$postmaster"; pgrep -P "$postmaster" || true; }
pin_postgres() {
  pg_mask=$(taskset -p "$postmaster" | awk '{print $NF}')
  local p
  for p in $(pg_pids); do taskset -a -p -c "$1" "$p" >/dev/null 2>&1 || true; done
}
unpin_postgres() {
  [[ -n $pg_mask ]] || return 0
  local p
  for p in $(pg_pids); do taskset -a -p "$pg_mask" "$p" >/dev/null 2>&1 || true; done
  pg_mask=""
}

alter_pid=""        # the rotation row's ALTER ROLE, running beside its storm
hold_pid=""         # the idle row's loginstorm -hold, sampled while it runs
storm_note_file=""  # a note the next recorded storm takes (the rotation's ALTER timing)
cleanup() {
  trap - EXIT INT TERM
  local t
  [[ -z $alter_pid ]] || kill "$alter_pid" 2>/dev/null || true
  [[ -z $hold_pid ]] || kill "$hold_pid" 2>/dev/null || true
  for t in "${!pid_of[@]}"; do stop_target "$t"; done
  unpin_postgres
  # The sandbox PostgreSQL is left running (deploy/sandbox.sh stop stops it).
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- configs ----------------------------------------------------------------
write_pgbouncer_ini "$cfg/pgbouncer" "$PGB_PORT" "$POOL_SIZE" "$MAX_CLIENT_CONN" "$BACKLOG" "$PG_PORT" "$PG_DB" "$PG_USER" "$PGPASSWORD"
write_pgtender_toml "$cfg/pgtender" "$PGT_PORT" "$POOL_SIZE" 2 "$BACKLOG" enabled_plain "$METRICS_PORT" "$PG_PORT" "$PG_DB" "$PG_USER" "$PGPASSWORD"
write_pgtender_toml "$cfg/pgtender-pinned" "$PGT_PORT" "$POOL_SIZE" 1 "$BACKLOG" enabled_plain "$METRICS_PORT" "$PG_PORT" "$PG_DB" "$PG_USER" "$PGPASSWORD"
write_pgtender_toml "$cfg/pgtender-rotation" "$ROT_PORT" "$POOL_SIZE" 2 "$BACKLOG" enabled_plain_allow_change "$ROT_METRICS_PORT" "$PG_PORT" "$PG_DB" "$PG_USER" "$PGPASSWORD"
for d in pgtender pgtender-pinned pgtender-rotation; do
  bin/pgtender --config "$cfg/$d/pgdog.toml" --users "$cfg/$d/users.toml" --check-config >"$logs/check-$d.log" 2>&1 \
    || { cat "$logs/check-$d.log" >&2; die "pgtender rejects $cfg/$d"; }
done
# The generator's fd limit: 10,000 held clients need as many descriptors.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
(( $(ulimit -n) > IDLE_CLIENTS + 1000 )) || die "fd limit $(ulimit -n) (hard $(ulimit -Hn)) is too low for IDLE_CLIENTS=$IDLE_CLIENTS"

# --- conditions -----------------------------------------------------------------
conditions() { # start | end
  echo "== $1 $(date -u +%FT%TZ)"
  echo "loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "busiest processes (top, 1 s):"
  busiest
}
{
  echo "commit $(git describe --always --dirty 2>/dev/null) $(git rev-parse HEAD) ($(git rev-parse --abbrev-ref HEAD))"
  echo "date $(date -u +%FT%TZ)  quick $BENCH_QUICK  rounds $ROUNDS  pool $POOL_SIZE  backlog $BACKLOG (both)"
  echo "rows: login ${LOGIN_SECONDS}s at $WORKERS workers; sweep $SWEEP at ${SWEEP_SECONDS}s; pgbench $PGBENCH_CELLS x $MODES at ${PGBENCH_SECONDS}s (-j <= $THREADS, warm-up ${PGBENCH_WARMUP}s); rotation ${ROTATION_SECONDS}s; idle $IDLE_CLIENTS clients; pinned $PINNED; ceiling ${CALIB_SECONDS}s before and after"
  echo "pgtender: bin/pgtender sha256 $(sha256sum bin/pgtender | cut -c1-12) '$(bin/pgtender -version 2>&1 | head -1)'; $(go version)"
  echo "pgtender config: transaction mode, workers = 2 (pinned: 1, GOMAXPROCS=1), default_pool_size = $POOL_SIZE, passthrough enabled_plain (rotation: enabled_plain_allow_change), listen_backlog = $BACKLOG, idle_timeout = 0, connection logging off, /metrics on $METRICS_PORT (rotation: $ROT_METRICS_PORT)"
  echo "pgbouncer: $(pgbouncer --version | head -1): transaction mode, auth_type plain + userlist, default_pool_size = $POOL_SIZE, max_client_conn $MAX_CLIENT_CONN, listen_backlog = $BACKLOG, server_idle_timeout 0, logging off"
  echo "loginstorm: bin/loginstorm sha256 $(sha256sum bin/loginstorm | cut -c1-12); loginceiling: bin/loginceiling"
  echo "$(pgbench --version)  server $(pg_setting server_version): max_connections $max_conn, fsync $(pg_setting fsync), log_connections $(pg_setting log_connections), password_encryption $(pg_setting password_encryption)"
  echo "postgres: $pg_note; postmaster pid $postmaster, data $pg_datadir, affinity $(taskset -p "$postmaster" | awk '{print $NF}')"
  echo "nproc $(nproc)  somaxconn $(sysctl -n net.core.somaxconn)  tcp_max_syn_backlog $(sysctl -n net.ipv4.tcp_max_syn_backlog)  ports $(sysctl -n net.ipv4.ip_local_port_range | tr '\t' -)  fd limit $(ulimit -n) (hard $(ulimit -Hn))"
  conditions start
} | tee "$out/conditions.txt" >&2

# --- the measurements -------------------------------------------------------------
load1() { cut -d' ' -f1 /proc/loadavg; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
fds() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }

# storm KIND ROUND TARGET PARAM SECONDS [loginstorm args...]: one recorded
# loginstorm run against TARGET.
storm() {
  local kind=$1 round=$2 t=$3 param=$4 secs=$5; shift 5
  local file=$logs/$kind-r$round-$t-$param.json rc=0 pid="" c0=0 cpu=- load metrics=() note=""
  if ! ensure_target "$t"; then
    record "$kind" "$round" "$t" "$param" - - - - - - - - "$t not running"
    return
  fi
  [[ $t == direct ]] || pid=${pid_of[$t]}
  [[ $t == pgtender && $kind == login ]] && metrics=(-metrics "http://127.0.0.1:$METRICS_PORT/metrics")
  [[ $t == rotation ]] && metrics=(-metrics "http://127.0.0.1:$ROT_METRICS_PORT/metrics")
  load=$(load1)
  [[ -n $pid ]] && c0=$(cpu_us "$pid")
  # -passwords (the rotation row) replaces -password.
  [[ " $* " == *" -passwords "* ]] || set -- -password "$PGPASSWORD" "$@"
  timeout -k 5 $(( secs + 40 )) "${gen[@]}" bin/loginstorm -addr "127.0.0.1:$(port_of "$t")" \
    -json -progress never -duration "${secs}s" "${metrics[@]}" "$@" >"$file" 2>"$file.stderr" || rc=$?
  [[ -n $pid ]] && cpu=$(( $(cpu_us "$pid") - c0 ))
  [[ -n $storm_note_file && -f $storm_note_file ]] && note=$(tr '\t\n' '  ' <"$storm_note_file")
  if [[ $t == rotation ]]; then
    # What the registry did with passwords it had not verified: A at the
    # warm-up and B at the switch, each verified once, nothing rejected, is
    # a clean rotation.
    note+="; passthrough verifications since start: $(curl -s -m 5 "http://127.0.0.1:$ROT_METRICS_PORT/metrics" \
      | sed -n 's/^[a-z_]*passthrough_verifications_total{result="\([a-z_]*\)"} \(.*\)$/\1=\2/p' | tr '\n' ' ' || true)"
  fi
  record "$kind" "$round" "$t" "$param" "$rc" "$cpu" "$load" - - - - "$file" "$note"
  say "round $round $kind $t $param: exit $rc, $(summary_line "$file")"
}
summary_line() { "$PYTHON" "$repo/deploy/bench/bench-report.py" --line "$1" 2>/dev/null || echo "no summary"; }

# warm TARGET: 1 s of unrecorded logins.
warm() {
  ensure_target "$1" || return 0
  timeout 30 "${gen[@]}" bin/loginstorm -addr "127.0.0.1:$(port_of "$1")" -password "$PGPASSWORD" -c "$WORKERS" \
    -duration 1s -json -progress never >/dev/null 2>&1 || true
}

# cell KIND ROUND TARGET SCRIPT CLIENTS MODE: one recorded pgbench.
cell() {
  local kind=$1 round=$2 t=$3 script=$4 n=$5 mode=$6
  local param=$script:$n:$mode file rc=0 pid="" c0=0 cpu=- load sel=()
  file=$logs/$kind-r$round-$t-$script-c$n-$mode.log
  if [[ $t == direct ]] && (( n > max_conn - 40 )); then
    record "$kind" "$round" "$t" "$param" - - - - - - - - "skipped: $n clients > max_connections $max_conn less 40"
    return
  fi
  if ! ensure_target "$t"; then
    record "$kind" "$round" "$t" "$param" - - - - - - - - "$t not running"
    return
  fi
  [[ $t == direct ]] || pid=${pid_of[$t]}
  [[ $script == S ]] && sel=(-S)
  load=$(load1)
  [[ -n $pid ]] && c0=$(cpu_us "$pid")
  # timeout: a pooler that stops answering costs one cell, not the run.
  timeout -k 5 $(( PGBENCH_SECONDS + 60 )) "${gen[@]}" pgbench -n "${sel[@]}" -M "$mode" -c "$n" -j $(( n < THREADS ? n : THREADS )) \
    -T "$PGBENCH_SECONDS" -h 127.0.0.1 -p "$(port_of "$t")" -U "$PG_USER" "$PG_DB" >"$file" 2>&1 || rc=$?
  [[ -n $pid ]] && cpu=$(( $(cpu_us "$pid") - c0 ))
  record "$kind" "$round" "$t" "$param" "$rc" "$cpu" "$load" - - - - "$file" ""
  say "round $round $kind $t $param: exit $rc, $(awk '/^tps = / {print $3 " tps"; exit}' "$file")"
}

# idle ROUND TARGET: RSS per idle logged-in client on a fresh pooler.
idle() {
  local round=$1 t=$2 file=$logs/idle-r$1-$2.json rc=0 pid rss0 rss1 fds0 fds1 load c0 cpu note=""
  if ! start_target "$t"; then
    record idle "$round" "$t" "$IDLE_CLIENTS" - - - - - - - - "$t did not start"
    return
  fi
  pid=${pid_of[$t]}
  warm "$t"
  sleep 1
  rss0=$(rss_kib "$pid") fds0=$(fds "$pid") load=$(load1) c0=$(cpu_us "$pid")
  # The held connections open first (a few dozen at a time); then a 1-login/s
  # open loop runs while they stay open, past the sample.
  timeout -k 5 120 bin/loginstorm -addr "127.0.0.1:$(port_of "$t")" -password "$PGPASSWORD" -hold "$IDLE_CLIENTS" \
    -rate 1 -duration "$(( IDLE_SETTLE + 3 ))s" -json -progress never >"$file" 2>"$file.stderr" &
  hold_pid=$!
  for _ in $(seq 600); do   # up to 60 s for the clients to be held
    (( $(fds "$pid") >= fds0 + IDLE_CLIENTS )) && break
    kill -0 "$hold_pid" 2>/dev/null || break
    sleep 0.1
  done
  sleep "$IDLE_SETTLE"
  rss1=$(rss_kib "$pid") fds1=$(fds "$pid")
  (( fds1 >= fds0 + IDLE_CLIENTS )) || note="only $(( fds1 - fds0 )) more descriptors than before when sampled"
  wait "$hold_pid" || rc=$?
  hold_pid=""
  cpu=$(( $(cpu_us "$pid") - c0 ))
  record idle "$round" "$t" "$IDLE_CLIENTS" "$rc" "$cpu" "$load" "$rss0" "$rss1" "$fds0" "$fds1" "$file" "$note"
  say "round $round idle $t: RSS $rss0 -> $rss1 KiB with $IDLE_CLIENTS clients (fds $fds0 -> $fds1)"
  stop_target "$t"
}

# rotation ROUND: the rotation storm on a fresh pgtender in allow_change mode.
# Postgres first, then the clients (docs/auth.md, "Rotating a password"):
# ALTER ROLE a quarter of the way in, the switch to B halfway, so that the
# ALTER has long finished on a busy machine (a B presented before it would
# be refused and kept in the negative cache for 10 s).
rotation() {
  local round=$1 half=$(( ROTATION_SECONDS * 1000 / 2 )) quarter
  quarter=$(printf '%d.%03d' $(( half / 2000 )) $(( half / 2 % 1000 )))
  if [[ $rotation_ok != 1 ]]; then
    record rotation "$round" rotation "$WORKERS" - - - - - - - - "skipped: role $ROT_ROLE could not be made"
    return
  fi
  superuser_psql -c "ALTER ROLE $ROT_ROLE PASSWORD '$ROT_A'" >>"$logs/rotation-alter.log" 2>&1 || true
  start_target rotation || true
  if alive rotation; then
    timeout 30 bin/loginstorm -addr "127.0.0.1:$ROT_PORT" -user "$ROT_ROLE" -password "$ROT_A" -c "$WORKERS" \
      -duration 1s -json -progress never >/dev/null 2>&1 || true
  fi
  storm_note_file=$logs/rotation-r$round.note
  ( t0=$(date +%s%N)
    sleep "$quarter"
    if superuser_psql -c "ALTER ROLE $ROT_ROLE PASSWORD '$ROT_B'" >>"$logs/rotation-alter.log" 2>&1; then
      echo "ALTER ROLE to B done $(( ($(date +%s%N) - t0) / 1000000 )) ms after the storm began; switch to B at ${half} ms"
    else
      echo "ALTER ROLE to B FAILED (see rotation-alter.log); switch to B at ${half} ms"
    fi >"$storm_note_file" ) &
  alter_pid=$!
  storm rotation "$round" rotation "$WORKERS" "$ROTATION_SECONDS" -c "$WORKERS" -user "$ROT_ROLE" \
    -passwords "$ROT_A,$ROT_B" -password-switch-after "${half}ms"
  wait "$alter_pid" || true
  alter_pid="" storm_note_file=""
  stop_target rotation
}

# rotated ROUND TARGET...: the targets, rotated by ROUND-1.
rotated() {
  local round=$1; shift
  local a=("$@") k
  k=$(( (round - 1) % ${#a[@]} ))
  echo "${a[@]:$k}" "${a[@]:0:$k}"
}

# --- calibration before -------------------------------------------------------------
calibrate() { # before | after
  if start_target ceiling; then
    warm ceiling
    storm calib "$1" ceiling "$WORKERS" "$CALIB_SECONDS" -c "$WORKERS"
  else
    record calib "$1" ceiling "$WORKERS" - - - - - - - - "loginceiling did not start"
  fi
  stop_target ceiling
}
calibrate before

for round in $(seq "$ROUNDS"); do
  say "--- round $round of $ROUNDS"
  for t in pgtender pgbouncer; do start_target "$t" || true; done
  for t in $(rotated "$round" pgtender pgbouncer); do warm "$t"; done
  for t in $(rotated "$round" pgtender pgbouncer direct); do
    storm login "$round" "$t" "$WORKERS" "$LOGIN_SECONDS" -c "$WORKERS"
  done
  for n in $SWEEP; do
    for t in $(rotated "$round" pgtender pgbouncer); do
      storm sweep "$round" "$t" "$n" "$SWEEP_SECONDS" -c "$n"
    done
  done
  if (( PGBENCH_WARMUP > 0 )); then
    for t in $(rotated "$round" direct pgbouncer pgtender); do
      ensure_target "$t" || continue
      timeout 60 pgbench -n -S -c 32 -j "$THREADS" -T "$PGBENCH_WARMUP" -h 127.0.0.1 -p "$(port_of "$t")" \
        -U "$PG_USER" "$PG_DB" >"$logs/pgbench-warmup-r$round-$t.log" 2>&1 || true
    done
  fi
  for c in $PGBENCH_CELLS; do
    for mode in $MODES; do
      for t in $(rotated "$round" direct pgbouncer pgtender); do
        cell pgbench "$round" "$t" "${c%%:*}" "${c#*:}" "$mode"
      done
    done
  done
  stop_target pgtender
  stop_target pgbouncer

  rotation "$round"

  for t in $(rotated "$round" pgtender pgbouncer); do idle "$round" "$t"; done

  if [[ $PINNED == 1 ]]; then
    pin_postgres 1
    pinned_run=0
    gen=(taskset -c 1)
    for t in pgtender pgbouncer ceiling; do start_target "$t" || true; done
    for t in $(rotated "$round" pgtender pgbouncer ceiling); do warm "$t"; done
    for t in $(rotated "$round" pgtender pgbouncer ceiling); do
      storm pinned_login "$round" "$t" "$WORKERS" "$LOGIN_SECONDS" -c "$WORKERS"
    done
    for t in $(rotated "$round" pgtender pgbouncer); do
      cell pinned_pgbench "$round" "$t" S 32 simple
    done
    for t in pgtender pgbouncer ceiling; do stop_target "$t"; done
    pinned_run=""
    gen=()
    unpin_postgres
  fi
done

calibrate after

conditions end | tee -a "$out/conditions.txt" >&2
echo "total $(( $(date +%s) - started )) s" | tee -a "$out/conditions.txt" >&2

"$PYTHON" "$repo/deploy/bench/bench-report.py" "$out" || die "bench-report.py failed (the raw measurements are in $tsv)"
cat "$out/report.md"
say "report: $out/report.md and $out/report.json"
