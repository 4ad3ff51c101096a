#!/usr/bin/env bash
# A three-node MariaDB Galera cluster (multi-primary) on loopback, for the cluster suite:
#   scripts/galera.sh start|stop|status|kill N|restart N|isolate N|rejoin N
# Nodes listen on 127.0.0.1:3311, 3312 and 3313 (root, no password), with their data
# directories under $GALERA_DIR (default /tmp/diesel-inbox-galera). No state transfer is
# needed: node 1 is initialised and shut down cleanly, and its data directory copied to
# the others, so all three start from the same state.
set -euo pipefail

base=${GALERA_DIR:-/tmp/diesel-inbox-galera}
provider=/usr/lib/galera/libgalera_smm.so
cluster="gcomm://127.0.0.1:4571,127.0.0.1:4572,127.0.0.1:4573"

port() { echo $((3310 + $1)); }

# Each node has a temporary directory of its own: a starting server deletes every
# `#sql*` file in its tmpdir, which in the shared /tmp would include the internal
# temporary tables of the machine's own MariaDB, failing its queries in flight ("Error
# on delete of '/tmp/#sql-temptable-…'").
node_args() {
    local n=$1
    echo --no-defaults --user=mysql --datadir="$base/node$n" --tmpdir="$base/node$n.tmp" \
        --socket="$base/node$n.sock" --pid-file="$base/node$n.pid" \
        --log-error="$base/node$n.err" --port="$(port "$n")" --bind-address=127.0.0.1 \
        --skip-name-resolve --binlog-format=ROW --default-storage-engine=InnoDB \
        --innodb-autoinc-lock-mode=2 --innodb-buffer-pool-size=64M \
        --wsrep-on=ON --wsrep-provider="$provider" --wsrep-cluster-name=diesel-inbox \
        --wsrep-node-name="node$n" --wsrep-node-address="127.0.0.1:$((4570 + n))" \
        --wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:$((4570 + n));ist.recv_addr=127.0.0.1:$((4580 + n));gcache.size=64M" \
        --wsrep-sst-method=rsync --wsrep-sst-receive-address="127.0.0.1:$((4590 + n))"
}

sql() {
    mariadb --protocol=tcp -h127.0.0.1 -P"$(port "$1")" -uroot -N -B -e "$2"
}

wait_for() {
    local n=$1 what=$2
    for _ in $(seq 1 120); do
        if [ "$(sql "$n" "SHOW STATUS LIKE 'wsrep_ready'" 2>/dev/null | cut -f2)" = ON ]; then
            [ "$what" = ready ] && return 0
            [ "$(sql "$n" "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2)" = 3 ] && return 0
        fi
        sleep 0.5
    done
    echo "galera: node $n not $what; see $base/node$n.err" >&2
    return 1
}

start_node() {
    local n=$1 extra=${2:-}
    install -d -o mysql -g mysql "$base/node$n.tmp"
    # shellcheck disable=SC2046,SC2086
    setsid /usr/sbin/mariadbd $(node_args "$n") --wsrep-cluster-address="$cluster" $extra \
        </dev/null >/dev/null 2>&1 &
}

initialise() {
    rm -rf "$base"
    mkdir -p "$base"
    mariadb-install-db --no-defaults --user=mysql --datadir="$base/node1" \
        --auth-root-authentication-method=normal >"$base/install.log" 2>&1
    chown -R mysql:mysql "$base"
    install -d -o mysql -g mysql "$base/node1.tmp"
    # Bootstrap once so that the data directory carries the cluster's state, then shut
    # it down cleanly and clone it.
    # shellcheck disable=SC2046
    setsid /usr/sbin/mariadbd $(node_args 1) --wsrep-cluster-address=gcomm:// \
        --wsrep-new-cluster </dev/null >/dev/null 2>&1 &
    wait_for 1 ready
    sql 1 "CREATE DATABASE IF NOT EXISTS test"
    stop_node 1
    for n in 2 3; do
        cp -a "$base/node1" "$base/node$n"
    done
}

stop_node() {
    local n=$1
    if [ -f "$base/node$n.pid" ]; then
        local pid
        pid=$(cat "$base/node$n.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 120); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        rm -f "$base/node$n.pid"
    fi
}

stop_all() {
    local n
    for n in 3 2 1; do stop_node "$n"; done
}

case ${1:-} in
start)
    # A fresh cluster at every start. A run that killed or isolated nodes can leave them
    # at different positions, and a node behind the bootstrapped one needs a state
    # transfer, which on a loaded machine can outlast the wait below.
    stop_all
    initialise
    sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "$base/node1/grastate.dat"
    start_node 1 --wsrep-new-cluster
    wait_for 1 ready
    # One joiner at a time: two at once may both ask for a state transfer.
    start_node 2
    wait_for 2 ready
    start_node 3
    for n in 1 2 3; do wait_for "$n" clustered; done
    echo "galera: 3 nodes on 127.0.0.1:3311-3313"
    ;;
stop)
    stop_all
    ;;
status)
    for n in 1 2 3; do
        printf 'node %s: ' "$n"
        sql "$n" "SHOW STATUS WHERE Variable_name IN ('wsrep_cluster_size','wsrep_ready')" 2>/dev/null | tr '\n' ' ' || printf 'down'
        echo
    done
    ;;
kill)
    # SIGKILL, as a crashed node: no clean shutdown.
    kill -9 "$(cat "$base/node$2.pid")"
    rm -f "$base/node$2.pid"
    ;;
restart)
    start_node "$2"
    wait_for "$2" clustered
    ;;
isolate)
    # Cuts node N off from the others, as a network partition does: it leaves the
    # primary component once the others stop hearing from it, after some seconds.
    sql "$2" "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=1'"
    ;;
rejoin)
    sql "$2" "SET GLOBAL wsrep_provider_options = 'gmcast.isolate=0'"
    for n in 1 2 3; do wait_for "$n" clustered; done
    ;;
*)
    echo "usage: $0 start|stop|status|kill N|restart N|isolate N|rejoin N" >&2
    exit 2
    ;;
esac
