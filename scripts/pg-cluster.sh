# shellcheck shell=bash
# Source this file, then `pg_cluster_start BIN_DIR` exports DATABASE_URL for a
# throwaway cluster in a fresh /tmp directory; `pg_cluster_stop` removes it.
# PostgreSQL refuses to run as root, so as root the server runs as `postgres`
# (the data directory lives under /tmp because a clone under /root is not
# readable by that user).

pg_cluster_start() {
    local bin=$1 as=()
    PG_BIN=$bin
    PGDATA_DIR=$(mktemp -d /tmp/retention-pg.XXXXXX)
    if [ "$(id -u)" = "0" ]; then
        id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
        chown postgres "$PGDATA_DIR"
        as=(runuser -u postgres --)
    fi
    PG_AS=("${as[@]}")
    PG_PORT=$("${PYTHON:-python3}" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "${PG_AS[@]}" "$bin/initdb" -D "$PGDATA_DIR/data" -U postgres --auth=trust -E UTF8 >"$PGDATA_DIR/initdb.log" 2>&1 \
        || { cat "$PGDATA_DIR/initdb.log"; return 1; }
    "${PG_AS[@]}" "$bin/pg_ctl" -D "$PGDATA_DIR/data" -l "$PGDATA_DIR/data/log" -w \
        -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
        start >/dev/null || { cat "$PGDATA_DIR/data/log"; return 1; }
    export DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/app"
    export PGDATA_DIR PG_BIN PG_PORT
}

pg_cluster_restart() {
    "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PGDATA_DIR/data" -l "$PGDATA_DIR/data/log" -m fast -w restart >/dev/null
}

pg_cluster_stop() {
    if [ -n "${PGDATA_DIR:-}" ] && [ -d "$PGDATA_DIR/data" ]; then
        "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PGDATA_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "$PGDATA_DIR"
    fi
}
