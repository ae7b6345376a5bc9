#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on 127.0.0.1 for the tests, and print the line that hands its URL on:
#
#   eval "$(bash .ci/postgres.sh)"     # exports AUTOPELT_TEST_POSTGRES_URL
#   bash .ci/postgres.sh stop          # stops it (the data folder is deleted)
#
# Runs as root (CI and the developers' machines): installs Debian's postgresql when missing, then runs
# initdb + pg_ctl as the `postgres` user in a folder of its own, so the system cluster is never touched.
# Idempotent: a server already started by this script is reused. Progress goes to stderr; stdout carries
# only the export line.
set -euo pipefail

PORT="${AUTOPELT_PG_PORT:-55432}"
ROOT="${AUTOPELT_PG_DIR:-/tmp/autopelt-postgres}"
DB=autopelt_test
URL="postgresql+psycopg2://postgres@127.0.0.1:${PORT}/${DB}"

log() { echo "postgres.sh: $*" >&2; }

pg_bin() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$dir" ] && echo "$dir"
}

as_postgres() { runuser -u postgres -- "$@"; }

if [ "${1:-}" = "stop" ]; then
    bin=$(pg_bin) || exit 0
    [ -f "$ROOT/data/postmaster.pid" ] && as_postgres "$bin/pg_ctl" -D "$ROOT/data" -m fast -w stop >&2 || true
    rm -rf "$ROOT"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    log "run me as root (I install packages and switch to the postgres user)"
    exit 1
fi

if ! bin=$(pg_bin) || ! id postgres >/dev/null 2>&1; then
    log "installing postgresql"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends postgresql >&2
    bin=$(pg_bin)
fi

if ! as_postgres "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT"; then
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    chown postgres: "$ROOT"
    log "initdb in $ROOT/data"
    as_postgres "$bin/initdb" -D "$ROOT/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    log "starting on 127.0.0.1:$PORT"
    # max_connections: several search processes, each with a pool, plus the test process
    as_postgres "$bin/pg_ctl" -D "$ROOT/data" -l "$ROOT/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $PORT -k $ROOT -c max_connections=200 -c fsync=off" start >&2
fi

if ! as_postgres "$bin/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
    as_postgres "$bin/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
fi
log "ready: $URL"
echo "export AUTOPELT_TEST_POSTGRES_URL=$URL"
