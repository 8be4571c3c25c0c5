#!/usr/bin/env bash
# Local sandbox: a throwaway PostgreSQL on 127.0.0.1:5432 with role and database
# "pgtender" (password "pgtender"), and pgtender in front of it on 127.0.0.1:6432
# with its metrics on http://127.0.0.1:9930/metrics (pgdog.toml.example).
#
# Everything listens on loopback only, since the passwords are public. To
# reach pgtender from other machines, copy pgdog.toml.example and users.toml.example,
# set host = "0.0.0.0" (and openmetrics_host = "0.0.0.0" for the metrics) and
# passwords of your own, and run bin/pgtender --config ... --users ... on them.
#
#   deploy/sandbox.sh          create the cluster once (reused afterwards), start it,
#                              build pgtender and run it in the foreground;
#                              Ctrl-C stops pgtender, then PostgreSQL
#   deploy/sandbox.sh start    only start PostgreSQL and leave it running
#   deploy/sandbox.sh stop     stop PostgreSQL
#   deploy/sandbox.sh status   say where the cluster is and whether it runs
#   deploy/sandbox.sh bindir   print where the PostgreSQL server binaries are
#
# The cluster lives in .sandbox/pg in the repository (git-ignored). When run as
# root, PostgreSQL runs as the postgres OS user, and if that user cannot reach
# the repository the cluster goes to /tmp/pgtender-sandbox-$UID instead.
# $PGTENDER_PG_BINDIR overrides where the PostgreSQL server binaries are found.
set -euo pipefail

readonly PG_HOST=127.0.0.1 PG_PORT=5432
readonly APP_ROLE=pgtender APP_PASSWORD=pgtender APP_DB=pgtender
readonly EXAMPLE=pgdog.toml.example

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

say() { printf 'sandbox: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

# example_value prints the value of a [general] key written (not commented
# out) in pgdog.toml.example, without quotes, or $2 when it is not written.
example_value() {
  local v
  v=$(sed -n -E '/^\[general\]/,/^\[/{s/^'"$1"'[[:space:]]*=[[:space:]]*"?([^"#]*[^"#[:space:]])"?.*/\1/p;}' "$repo/$EXAMPLE" | head -n 1)
  echo "${v:-$2}"
}

# loopback says whether an address is a loopback one.
loopback() { [[ $1 == 127.* || $1 == ::1 || $1 == localhost ]]; }

# bindir finds initdb, pg_ctl and postgres the way internal/testpg.BinDir does.
bindir() {
  local d
  has_server() { [[ -x $1/initdb && -x $1/pg_ctl && -x $1/postgres ]]; }
  if [[ -n ${PGTENDER_PG_BINDIR:-} ]]; then
    has_server "$PGTENDER_PG_BINDIR" || die "\$PGTENDER_PG_BINDIR=$PGTENDER_PG_BINDIR lacks initdb, pg_ctl or postgres"
    echo "$PGTENDER_PG_BINDIR"; return
  fi
  if d=$(pg_config --bindir 2>/dev/null) && has_server "$d"; then echo "$d"; return; fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5Vr); do
    if has_server "$d"; then echo "$d"; return; fi
  done
  if d=$(command -v initdb 2>/dev/null); then
    d=$(dirname "$(readlink -f "$d")")
    if has_server "$d"; then echo "$d"; return; fi
  fi
  die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; install the postgresql package (Debian: apt-get install postgresql) or set PGTENDER_PG_BINDIR"
}

# as_pg runs a command as the cluster's owner: postgres when we are root.
as_pg() {
  if [[ $EUID -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# cluster_base picks the directory that holds data/, the socket and the log.
cluster_base() {
  local base=$repo/.sandbox/pg
  if [[ $EUID -eq 0 ]] && ! runuser -u postgres -- test -x "$repo" 2>/dev/null; then
    base=/tmp/pgtender-sandbox-$UID
    say "the postgres user cannot reach $repo, so the cluster lives in $base"
  fi
  # The unix socket path must fit in 107 bytes.
  if (( ${#base} + 16 > 107 )); then
    base=/tmp/pgtender-sandbox-$UID
    say "$repo is too deep for a unix socket path, so the cluster lives in $base"
  fi
  [[ -L $base ]] && die "$base is a symlink; remove it"
  echo "$base"
}

# `sandbox.sh bindir` prints the server binaries' directory (.ci/run uses it).
if [[ ${1:-} == bindir ]]; then bindir; exit; fi

bin=$(bindir)
base=$(cluster_base)
data=$base/data
log=$base/postgres.log
pg_ctl=("$bin/pg_ctl" -D "$data")
psql_bin=$bin/psql
[[ -x $psql_bin ]] || psql_bin=$(command -v psql) || die "psql not found; install postgresql-client"

running() { [[ -f $data/postmaster.pid ]] && as_pg "${pg_ctl[@]}" status >/dev/null 2>&1; }

# superuser_psql runs psql as the superuser over the cluster's private socket (trust).
superuser_psql() {
  as_pg "$psql_bin" -X -q -v ON_ERROR_STOP=1 -h "$base" -p "$PG_PORT" -U postgres -d postgres "$@"
}

create_cluster() {
  [[ -f $data/PG_VERSION ]] && return
  say "creating a PostgreSQL cluster in $base with $bin"
  # The postgres user must be able to traverse .sandbox whatever the umask.
  [[ $base == "$repo/.sandbox/pg" ]] && install -d -m 755 "$repo/.sandbox"
  mkdir -p "$base"
  if [[ $EUID -eq 0 ]]; then
    chown postgres: "$base"
  fi
  chmod 700 "$base"
  # No superuser password: the superuser logs in only over the socket in $base.
  as_pg "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    --encoding=UTF8 --locale=C --no-sync >"$base/initdb.log" 2>&1 \
    || { cat "$base/initdb.log" >&2; die "initdb failed"; }
  as_pg tee "$data/pg_hba.conf" >/dev/null <<EOF
# Written by deploy/sandbox.sh: SCRAM for TCP, trust only for the superuser on the private socket.
# TYPE  DATABASE  USER      ADDRESS       METHOD
local   all       postgres                trust
local   all       all                     scram-sha-256
host    all       all       127.0.0.1/32  scram-sha-256
host    all       all       ::1/128       scram-sha-256
EOF
  as_pg tee -a "$data/postgresql.conf" >/dev/null <<EOF

# deploy/sandbox.sh
listen_addresses = '$PG_HOST'
port = $PG_PORT
unix_socket_directories = '$base'
max_connections = 200
password_encryption = 'scram-sha-256'
log_connections = on
log_line_prefix = '%m [%p] %q%u@%d '
EOF
}

# start_pg starts PostgreSQL unless it runs already; started_here says which.
started_here=0
start_pg() {
  if running; then
    say "PostgreSQL is already running in $base; reusing it"
    return
  fi
  if (exec 3<>"/dev/tcp/$PG_HOST/$PG_PORT") 2>/dev/null; then
    die "port $PG_PORT on $PG_HOST is already in use (another PostgreSQL? see: ss -ltnp 'sport = :$PG_PORT'; Debian's own cluster: pg_lsclusters, systemctl stop postgresql)"
  fi
  local version
  version=$("$bin/postgres" --version | sed -E 's/^[^0-9]*([0-9]+).*/\1/')
  if [[ $(cat "$data/PG_VERSION") != "$version" ]]; then
    die "the cluster in $base is PostgreSQL $(cat "$data/PG_VERSION"), the binaries in $bin are $version; remove it (rm -rf $base) to start over"
  fi
  say "starting PostgreSQL on $PG_HOST:$PG_PORT (log: $log)"
  as_pg "${pg_ctl[@]}" -l "$log" -w -t 60 start >/dev/null \
    || { tail -n 30 "$log" >&2 || true; die "PostgreSQL did not start"; }
  started_here=1
}

stop_pg() {
  if running; then
    say "stopping PostgreSQL in $base"
    as_pg "${pg_ctl[@]}" -m fast -w -t 60 stop >/dev/null
  else
    say "PostgreSQL is not running in $base"
  fi
}

# ensure_app_role makes role and database pgtender; re-running resets the password.
ensure_app_role() {
  superuser_psql -v role="$APP_ROLE" -v password="$APP_PASSWORD" <<'EOF'
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') AS create_role \gset
\if :create_role
CREATE ROLE :"role" LOGIN;
\endif
SET password_encryption = 'scram-sha-256';
ALTER ROLE :"role" LOGIN PASSWORD :'password';
EOF
  superuser_psql -v role="$APP_ROLE" -v db="$APP_DB" <<'EOF'
SELECT NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') AS create_db \gset
\if :create_db
CREATE DATABASE :"db" OWNER :"role";
\endif
EOF
}

cmd_start() {
  create_cluster
  start_pg
  ensure_app_role
  say "PostgreSQL is up: psql \"postgres://$APP_ROLE:$APP_PASSWORD@$PG_HOST:$PG_PORT/$APP_DB\""
}

pgtender_pid=""
# cleanup runs at exit: it stops pgtender if it still runs, then PostgreSQL if
# this run started it.
cleanup() {
  trap - EXIT INT TERM
  if [[ -n $pgtender_pid ]] && kill -0 "$pgtender_pid" 2>/dev/null; then
    kill -TERM "$pgtender_pid" 2>/dev/null || true
    wait "$pgtender_pid" 2>/dev/null || true
  fi
  if [[ $started_here -eq 1 ]]; then stop_pg; fi
}

# on_signal passes Ctrl-C or SIGTERM to pgtender as SIGTERM (the first drains,
# a second exits at once), or ends the script if pgtender is not running yet.
# SIGTERM because a background job of a script starts with SIGINT ignored.
on_signal() {
  if [[ -n $pgtender_pid ]] && kill -TERM "$pgtender_pid" 2>/dev/null; then return 0; fi
  exit 130
}

cmd_run() {
  trap cleanup EXIT
  trap on_signal INT TERM
  create_cluster
  start_pg

  ensure_app_role
  (cd "$repo" && make --no-print-directory build)
  for f in pgdog.toml.example users.toml.example; do
    [[ -f $repo/$f ]] || die "$repo/$f is missing"
  done

  local host port mhost mport
  host=$(example_value host 0.0.0.0) port=$(example_value port 6432)
  mhost=$(example_value openmetrics_host 0.0.0.0) mport=$(example_value openmetrics_port 0)
  say "connect through the pooler with:"
  printf '\n    psql "postgres://%s:%s@127.0.0.1:%s/%s"\n\n' "$APP_ROLE" "$APP_PASSWORD" "$port" "$APP_DB" >&2
  if [[ $mport != 0 ]]; then
    say "metrics: curl -s http://127.0.0.1:$mport/metrics"
  fi
  local where="$host:$port" hport
  [[ $mport == 0 ]] || where+=" and $mhost:$mport (metrics)"
  hport=$(example_value healthcheck_port 0)
  if [[ $hport != 0 && $hport != "$mport" ]]; then
    say "healthcheck_port $hport listens on every address (it has no host setting); it serves no metrics and no logins"
  fi
  if loopback "$host" && { [[ $mport == 0 ]] || loopback "$mhost"; }; then
    say "pgtender listens on $where only (loopback: the passwords are public)"
    say "to listen wider, set host = \"0.0.0.0\" and openmetrics_host = \"0.0.0.0\" in a copy of $EXAMPLE, with passwords of your own"
  else
    say "WARNING: $EXAMPLE makes pgtender listen beyond loopback ($where) with the sandbox's public password"
  fi
  # Own session, so a terminal Ctrl-C reaches only this script, which forwards it once.
  cd "$repo"
  setsid bin/pgtender --config pgdog.toml.example --users users.toml.example &
  pgtender_pid=$!
  local status=0
  while :; do
    wait "$pgtender_pid" && status=0 || status=$?
    kill -0 "$pgtender_pid" 2>/dev/null || break   # wait was interrupted by a signal
  done
  pgtender_pid=""
  say "pgtender exited with status $status"
  return "$status"
}

cmd_status() {
  if running; then
    say "PostgreSQL is running in $base on $PG_HOST:$PG_PORT"
  elif [[ -f $data/PG_VERSION ]]; then
    say "PostgreSQL is stopped; cluster in $base"
  else
    say "no cluster yet (it will be created in $base)"
  fi
}

case ${1:-run} in
  run) cmd_run ;;
  start) cmd_start ;;
  stop) stop_pg ;;
  status) cmd_status ;;
  *) die "usage: $0 [run|start|stop|status|bindir]" ;;
esac
