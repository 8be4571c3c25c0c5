#!/usr/bin/env bash
# make bench-wave: reconnect waves against pgtender and PgBouncer, each capped
# by the SAME cgroup CPU quota (so the load generator is not the limit).
#
# For each peer: C = closed-loop capacity (loginstorm -c 64 -duration 10s);
# then for each listen backlog (128, 4096) open-loop waves at 0.5, 1, 1.5 and
# 3 C for 10 s with a 5 s client deadline. Prints a side-by-side table and
# keeps the raw loginstorm JSON (one object per line, failed trials included)
# under .sandbox/bench/wave-<timestamp>/.
#
# Needs root and a writable cgroup (v1 cpu controller or v2 with cpu in
# cgroup.controllers); without one it says why and exits 1.
#
# Environment (defaults in brackets):
#   QUOTA_PCT [20]        CPU quota for each pooler, percent of one CPU
#   BACKLOGS ["128 4096"] listen backlogs
#   MULTS ["0.5 1 1.5 3"] offered load, multiples of C
#   DURATION [10s]        length of each run; DEADLINE [5s] client deadline
#   POOL_SIZE [20]
#   REPEAT [3]            trials; each measures C and every wave for each peer,
#                         the peers alternating, and the table prints medians
#   PEERS ["pgtender pgbouncer"] which poolers to measure
#   PGT_GENERAL [""]      extra lines for pgtender's [general] (e.g. admission settings)
#   PGTENDER_BIN [bin/pgtender, built from the tree] the pgtender binary to
#                         measure (to compare builds: run once per binary)
#   GEN_QUOTA_PCT [""]    if set, the load generator runs in a cgroup of its own
#                         with this quota: a client population short of CPU,
#                         whose logins pause for most of each CFS period
# Loopback only: everything listens on and connects to 127.0.0.1.
set -euo pipefail

QUOTA_PCT=${QUOTA_PCT:-20}
BACKLOGS=${BACKLOGS:-"128 4096"}
MULTS=${MULTS:-"0.5 1 1.5 3"}
DURATION=${DURATION:-10s}
DEADLINE=${DEADLINE:-5s}
POOL_SIZE=${POOL_SIZE:-20}
PEERS=${PEERS:-"pgtender pgbouncer"}
REPEAT=${REPEAT:-3}
PGT_GENERAL=${PGT_GENERAL:-}
PGT_PORT=6432 PGB_PORT=6433 METRICS_PORT=9930
PERIOD_US=100000

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PGTENDER_BIN=${PGTENDER_BIN:-$repo/bin/pgtender}
cd "$repo"
say() { printf 'bench-wave: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

[[ $EUID -eq 0 ]] || die "must run as root (cgroup writes, pgbouncer as the postgres user)"

# --- cgroup ---------------------------------------------------------------
QUOTA_US=$(( PERIOD_US * QUOTA_PCT / 100 ))
cg_mode=""
cg_root=""
if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  if grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    cg_mode=v2 cg_root=/sys/fs/cgroup
  else
    die "cgroup v2 without the cpu controller (/sys/fs/cgroup/cgroup.controllers: $(cat /sys/fs/cgroup/cgroup.controllers)); cannot cap CPU"
  fi
elif [[ -d /sys/fs/cgroup/cpu && -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then
  cg_mode=v1 cg_root=/sys/fs/cgroup/cpu
else
  die "no cgroup cpu controller found (neither /sys/fs/cgroup/cgroup.controllers with cpu nor /sys/fs/cgroup/cpu); cannot cap CPU"
fi

# cg_make NAME [QUOTA_US]: creates the child cgroup with the quota (QUOTA_US
# by default); prints its path.
cg_make() {
  local d=$cg_root/pgtender-bench-$1 quota=${2:-$QUOTA_US}
  [[ -d $d ]] || mkdir "$d" 2>/dev/null || die "cannot create cgroup $d (read-only cgroup fs?)"
  if [[ $cg_mode == v1 ]]; then
    echo "$PERIOD_US" >"$d/cpu.cfs_period_us" 2>/dev/null || die "cannot write $d/cpu.cfs_period_us"
    echo "$quota" >"$d/cpu.cfs_quota_us" 2>/dev/null || die "cannot write $d/cpu.cfs_quota_us"
  else
    if ! grep -qw cpu "$cg_root/cgroup.subtree_control" 2>/dev/null; then
      echo +cpu >"$cg_root/cgroup.subtree_control" 2>/dev/null || die "cannot enable the cpu controller in $cg_root/cgroup.subtree_control"
    fi
    echo "$quota $PERIOD_US" >"$d/cpu.max" 2>/dev/null || die "cannot write $d/cpu.max"
  fi
  # Prove the cgroup accepts a process.
  bash -c "echo \$\$ >'$d/cgroup.procs'" 2>/dev/null || die "cannot move a process into $d/cgroup.procs"
  echo "$d"
}
pooler_cpu_us() { # utime+stime of the running pooler process, microseconds
  local t
  t=$(awk '{print $14 + $15}' "/proc/$peer_pid/stat" 2>/dev/null || echo 0)
  echo $(( t * 1000000 / $(getconf CLK_TCK) ))
}
cg_throttled() { # number of throttled periods
  awk '/^nr_throttled/ {print $2}' "$1/cpu.stat" 2>/dev/null || echo "?"
}

CG_PGT=$(cg_make pgtender)
CG_PGB=$(cg_make pgbouncer)
say "cgroup $cg_mode: quota ${QUOTA_US}us per ${PERIOD_US}us (${QUOTA_PCT}% of one CPU) in $CG_PGT and $CG_PGB"
CG_GEN=""
if [[ -n ${GEN_QUOTA_PCT:-} ]]; then
  CG_GEN=$(cg_make generator $(( PERIOD_US * GEN_QUOTA_PCT / 100 )))
  say "the load generator runs in $CG_GEN with ${GEN_QUOTA_PCT}% of one CPU"
fi

# --- results --------------------------------------------------------------
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=$repo/.sandbox/bench/wave-$stamp
mkdir -p "$out"
raw=$out/runs.jsonl
: >"$raw"
say "results in $out"

# --- cleanup --------------------------------------------------------------
peer_pid=""
pg_started=0
stop_peer() {
  if [[ -n $peer_pid ]] && kill -0 "$peer_pid" 2>/dev/null; then
    kill -TERM "$peer_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$peer_pid" 2>/dev/null || break; sleep 0.1; done
    kill -TERM "$peer_pid" 2>/dev/null || true   # pgtender: a second TERM exits at once
    for _ in $(seq 30); do kill -0 "$peer_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$peer_pid" 2>/dev/null || true
    wait "$peer_pid" 2>/dev/null || true
  fi
  peer_pid=""
}
cleanup() {
  trap - EXIT INT TERM
  stop_peer
  [[ $pg_started -eq 1 ]] && "$repo/deploy/sandbox.sh" stop || true
  rmdir "$CG_PGT" "$CG_PGB" ${CG_GEN:+"$CG_GEN"} 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- prerequisites ----------------------------------------------------------
if ! command -v pgbouncer >/dev/null; then
  say "installing pgbouncer (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >/dev/null || die "pgbouncer missing and apt-get install failed"
fi
systemctl stop pgbouncer 2>/dev/null || true   # Debian's unit, if any, would hold 6432
make --no-print-directory build >&2
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
say "fd limit for the generator: $(ulimit -n)"

"$repo/deploy/sandbox.sh" start
pg_started=1

# --- configs ----------------------------------------------------------------
cfg=$out/cfg
mkdir -p "$cfg"
chmod 755 "$out" "$cfg"

write_pgtender_cfg() { # backlog
  cat >"$cfg/pgdog.toml" <<EOF
[general]
host = "127.0.0.1"
port = $PGT_PORT
workers = 2
listen_backlog = $1
default_pool_size = $POOL_SIZE
min_pool_size = 1
pooler_mode = "transaction"
auth_type = "scram"
passthrough_auth = "enabled_plain"
openmetrics_port = $METRICS_PORT
openmetrics_host = "127.0.0.1"
log_connections = false
log_disconnections = false
$PGT_GENERAL

[admin]
password = "admin"

[[databases]]
name = "pgtender"
host = "127.0.0.1"
port = 5432
EOF
  cat >"$cfg/users.toml" <<EOF
[[users]]
name = "pgtender"
database = "pgtender"
password = "pgtender"
pool_size = $POOL_SIZE
EOF
}

write_pgbouncer_cfg() { # backlog
  cat >"$cfg/pgbouncer.ini" <<EOF
[databases]
pgtender = host=127.0.0.1 port=5432 dbname=pgtender

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = plain
auth_file = $cfg/userlist.txt
pool_mode = transaction
default_pool_size = $POOL_SIZE
max_client_conn = 20000
listen_backlog = $1
log_connections = 0
log_disconnections = 0
log_pooler_errors = 1
syslog = 0
logfile =
EOF
  echo '"pgtender" "pgtender"' >"$cfg/userlist.txt"
  chown postgres: "$cfg/pgbouncer.ini" "$cfg/userlist.txt"
  chmod 600 "$cfg/userlist.txt"
}

wait_port() { # port
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  return 1
}

# start_peer NAME BACKLOG: starts the pooler inside its cgroup.
start_peer() {
  local name=$1 backlog=$2
  stop_peer
  if [[ $name == pgtender ]]; then
    write_pgtender_cfg "$backlog"
    bash -c "echo \$\$ >'$CG_PGT/cgroup.procs'; ulimit -n \$(ulimit -Hn); exec '$PGTENDER_BIN' --config '$cfg/pgdog.toml' --users '$cfg/users.toml'" \
      >>"$out/pgtender.log" 2>&1 &
    peer_pid=$!
    wait_port "$PGT_PORT" || { tail -n 20 "$out/pgtender.log" >&2; die "pgtender did not listen on $PGT_PORT"; }
  else
    write_pgbouncer_cfg "$backlog"
    # setpriv keeps the raised fd limit (runuser resets it to 1024).
    bash -c "echo \$\$ >'$CG_PGB/cgroup.procs'; ulimit -n \$(ulimit -Hn); exec setpriv --reuid=postgres --regid=postgres --init-groups pgbouncer '$cfg/pgbouncer.ini'" \
      >>"$out/pgbouncer.log" 2>&1 &
    peer_pid=$!
    wait_port "$PGB_PORT" || { tail -n 20 "$out/pgbouncer.log" >&2; die "pgbouncer did not listen on $PGB_PORT"; }
  fi
  sleep 0.5
  kill -0 "$peer_pid" 2>/dev/null || die "$name exited right after starting (see $out/$name.log)"
  say "$name up (pid $peer_pid, backlog $backlog, fd limit $(awk '/open files/ {print $4}' /proc/$peer_pid/limits))"
}

# run_storm NAME BACKLOG MULT RATE ARGS...: one loginstorm run, one JSON line.
run_storm() {
  local name=$1 backlog=$2 mult=$3 rate=$4; shift 4
  local port=$PGT_PORT cg=$CG_PGT metrics=()
  if [[ $name == pgbouncer ]]; then port=$PGB_PORT cg=$CG_PGB; fi
  if [[ $name == pgtender ]]; then metrics=(-metrics "http://127.0.0.1:$METRICS_PORT/metrics"); fi
  local u0 t0 u1 t1 rc=0 js
  u0=$(pooler_cpu_us); t0=$(cg_throttled "$cg")
  local enter=()
  # The generator's own cgroup, if any: the shell moves itself in, then
  # becomes loginstorm.
  [[ -n $CG_GEN ]] && enter=(bash -c 'echo $$ >"$0/cgroup.procs" && shift && exec "$@"' "$CG_GEN" _)
  js=$(timeout 60 "${enter[@]}" "$repo/bin/loginstorm" -addr "127.0.0.1:$port" -password pgtender \
        -deadline "$DEADLINE" -json -progress never "${metrics[@]}" "$@" 2>"$out/last.stderr") || rc=$?
  u1=$(pooler_cpu_us); t1=$(cg_throttled "$cg")
  if ! jq -e . >/dev/null 2>&1 <<<"$js"; then
    say "loginstorm gave no JSON (exit $rc) for $name backlog=$backlog mult=$mult: $(tail -n 3 "$out/last.stderr")"
    js='{}'
  fi
  jq -c --arg peer "$name" --argjson backlog "$backlog" --arg mult "$mult" --argjson rate "$rate" \
        --argjson rc "$rc" --argjson cpu_us "$(( u1 - u0 ))" --arg thr "$(( t1 - t0 ))" \
        --arg quota "$QUOTA_PCT" --argjson trial "$trial" \
        '. + {bench: {peer: $peer, backlog: $backlog, mult: $mult, rate: $rate, exit: $rc,
              pooler_cpu_us: $cpu_us, throttled_periods: $thr, quota_pct: $quota, trial: $trial}}' <<<"$js" >>"$raw"
}

# --- the runs -----------------------------------------------------------------
dur_s=${DURATION%s}
dl_s=${DEADLINE%s}
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (dirty work tree)')"
  echo "pgtender binary $PGTENDER_BIN"
  echo "date $(date -u +%FT%TZ)  trials $REPEAT  cgroup $cg_mode  quota ${QUOTA_PCT}% of one CPU  pool $POOL_SIZE"
  [[ -n $PGT_GENERAL ]] && echo "pgtender [general] extra: $PGT_GENERAL"
  [[ -n $CG_GEN ]] && echo "load generator capped at ${GEN_QUOTA_PCT}% of one CPU"
  echo "nproc $(nproc)  loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "somaxconn $(sysctl -n net.core.somaxconn)  tcp_max_syn_backlog $(sysctl -n net.ipv4.tcp_max_syn_backlog)  syncookies $(sysctl -n net.ipv4.tcp_syncookies)"
  echo "$(go version 2>/dev/null || /usr/local/go/bin/go version)  $(pgbouncer --version | head -1)"
} | tee "$out/conditions.txt" >&2

for trial in $(seq "$REPEAT"); do
for peer in $PEERS; do
  first_backlog=${BACKLOGS%% *}
  start_peer "$peer" "$first_backlog"
  say "trial $trial/$REPEAT $peer: closed loop, 64 workers, $DURATION (capacity C)"
  run_storm "$peer" "$first_backlog" C 0 -c 64 -duration "$DURATION"
  C=$(tail -n 1 "$raw" | jq -r '.ontime_per_second // 0')
  say "$peer: C = $C logins/s"
  if ! awk -v c="$C" 'BEGIN{exit !(c > 0)}'; then
    say "$peer: capacity is zero; skipping its waves"; continue
  fi
  for backlog in $BACKLOGS; do
    start_peer "$peer" "$backlog"
    for mult in $MULTS; do
      rate=$(awk -v c="$C" -v m="$mult" 'BEGIN{printf "%d", c*m + 0.5}')
      maxout=$(awk -v r="$rate" -v d="$dl_s" 'BEGIN{printf "%d", r*(d+1) + 1000}')
      say "trial $trial $peer backlog $backlog: open loop $mult C = $rate logins/s for $DURATION"
      run_storm "$peer" "$backlog" "$mult" "$rate" -rate "$rate" -duration "$DURATION" -max-outstanding "$maxout"
      sleep 1
    done
  done
  stop_peer
done
done
echo "loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/conditions.txt" >&2

python3 "$repo/deploy/bench/wave-table.py" "$raw" "$dur_s" | tee "$out/table.md"
say "raw JSON lines: $raw"
