# deploy/bench/lib.sh: helpers shared by bench.sh (make bench) and
# bench-pgbench.sh (make bench-pgbench). Sourced, not run: the caller sets
# `set -euo pipefail`, defines say and die, sets repo and cds to it.
# Everything here listens on or connects to 127.0.0.1 only.

# port_open PORT: something accepts connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# results_dir KIND: makes .sandbox/bench/KIND-<UTC timestamp>/ with cfg/ and
# logs/ in it, reachable by the postgres user (PgBouncer reads its config
# there); sets out, cfg and logs.
results_dir() {
  out=$repo/.sandbox/bench/$1-$(date -u +%Y%m%dT%H%M%SZ)
  cfg=$out/cfg logs=$out/logs
  mkdir -p "$cfg" "$logs"
  chmod 755 "$repo/.sandbox" "$repo/.sandbox/bench" "$out" "$cfg"
}

# wait_port PORT: waits up to 10 s for 127.0.0.1:PORT to accept.
wait_port() {
  for _ in $(seq 100); do
    port_open "$1" && return 0
    sleep 0.1
  done
  return 1
}

# stop_pid PID: TERM, up to 5 s; a second TERM (pgtender drains on the
# first and exits at once on the second), up to 3 s; then KILL. Reaps it
# when it is this shell's child.
stop_pid() {
  local pid=$1
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# cpu_us PID: the process's utime+stime (all its threads) in microseconds,
# 0 when it is gone.
cpu_us() {
  local t
  t=$(awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0)
  echo $(( t * 1000000 / $(getconf CLK_TCK) ))
}

# busiest: the busiest processes over one second (top's second frame).
busiest() {
  top -b -n 2 -d 1 -w 200 2>/dev/null | awk '/^top -/ {n++} n == 2' | sed -n '7,18p' || true
}

# ensure_pgbouncer: installs Debian's pgbouncer if it is missing and stops
# Debian's own unit, which would hold port 6432.
ensure_pgbouncer() {
  if ! command -v pgbouncer >/dev/null; then
    say "installing pgbouncer (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >/dev/null 2>&1 \
      || { apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y pgbouncer >/dev/null; } \
      || die "pgbouncer missing and apt-get install failed"
  fi
  systemctl stop pgbouncer 2>/dev/null || true
}

# use_postgres HOST PORT USER DB: makes sure the sandbox PostgreSQL runs
# (deploy/sandbox.sh start) or that the one already on PORT (another
# worktree's sandbox?) lets USER log in to DB; sets pg_note to what was done.
# PGPASSWORD must be set.
use_postgres() {
  if port_open "$2" && ! deploy/sandbox.sh status 2>&1 | grep -q 'is running'; then
    # sandbox.sh would refuse to start on a taken port.
    timeout 30 psql -X -q -h "$1" -p "$2" -U "$3" -d "$4" -c 'SELECT 1' >/dev/null 2>&1 \
      || die "port $2 is in use by a PostgreSQL where $3/$4 cannot log in"
    pg_note="reused a PostgreSQL already on $1:$2 that is not this worktree's sandbox"
  else
    deploy/sandbox.sh start
    pg_note="deploy/sandbox.sh start (this worktree's sandbox; left running)"
  fi
}

# write_pgbouncer_ini DIR PORT POOL MAX_CLIENT_CONN BACKLOG PG_PORT DB USER
# PASSWORD: DIR/pgbouncer.ini and DIR/userlist.txt, readable by postgres:
# transaction mode, auth_type plain (clients are asked for a cleartext
# password, as pgtender's passthrough does), connection logging off, pools
# kept warm (server_idle_timeout 0, as pgtender's idle_timeout = 0). An
# empty BACKLOG keeps PgBouncer's default.
write_pgbouncer_ini() {
  local dir=$1
  mkdir -p "$dir"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
$7 = host=127.0.0.1 port=$6 dbname=$7

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $2
unix_socket_dir =
auth_type = plain
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = $3
max_client_conn = $4
${5:+listen_backlog = $5}
; pools stay warm while the other targets run (pgtender: idle_timeout = 0)
server_idle_timeout = 0
log_connections = 0
log_disconnections = 0
log_stats = 0
log_pooler_errors = 1
syslog = 0
logfile =
EOF
  echo "\"$8\" \"$9\"" >"$dir/userlist.txt"
  chmod 755 "$dir"
  chown postgres: "$dir/pgbouncer.ini" "$dir/userlist.txt"
  chmod 600 "$dir/userlist.txt"
}

# write_pgtender_toml DIR PORT POOL WORKERS BACKLOG PASSTHROUGH METRICS_PORT
# PG_PORT DB USER PASSWORD: DIR/pgdog.toml and DIR/users.toml, the same
# work as write_pgbouncer_ini's. An empty BACKLOG keeps pgtender's default;
# METRICS_PORT 0 means no metrics endpoint.
write_pgtender_toml() {
  local dir=$1
  mkdir -p "$dir"
  cat >"$dir/pgdog.toml" <<EOF
[general]
host = "127.0.0.1"
port = $2
workers = $4
${5:+listen_backlog = $5}
default_pool_size = $3
pooler_mode = "transaction"
auth_type = "scram"
passthrough_auth = "$6"
# pools stay warm while the other targets run (PgBouncer: server_idle_timeout = 0)
idle_timeout = 0
openmetrics_port = $7
openmetrics_host = "127.0.0.1"
log_connections = false
log_disconnections = false

[admin]
password = "admin"

[[databases]]
name = "$9"
host = "127.0.0.1"
port = $8
EOF
  cat >"$dir/users.toml" <<EOF
[[users]]
name = "${10}"
database = "$9"
password = "${11}"
pool_size = $3
EOF
}

# launch_pgbouncer INI LOG [CPULIST]: starts PgBouncer in the background as
# the postgres user with the fd limit raised to the hard limit (setpriv
# keeps it; runuser resets it to 1024), pinned to CPULIST when given; sets
# launched_pid.
launch_pgbouncer() {
  local pin=()
  [[ -n ${3:-} ]] && pin=(taskset -c "$3")
  "${pin[@]}" bash -c "ulimit -n \$(ulimit -Hn); exec setpriv --reuid=postgres --regid=postgres --init-groups pgbouncer '$1'" \
    >>"$2" 2>&1 &
  launched_pid=$!
}

# launch_pgtender BIN DIR LOG [CPULIST]: starts BIN with DIR's pgdog.toml
# and users.toml in the background, fd limit raised, pinned to CPULIST
# with GOMAXPROCS=1 when given; sets launched_pid.
launch_pgtender() {
  local pin=()
  [[ -n ${4:-} ]] && pin=(taskset -c "$4" env GOMAXPROCS=1)
  "${pin[@]}" bash -c "ulimit -n \$(ulimit -Hn); exec '$1' --config '$2/pgdog.toml' --users '$2/users.toml'" \
    >>"$3" 2>&1 &
  launched_pid=$!
}
