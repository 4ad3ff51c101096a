#!/usr/bin/env bash
# A Kafka-compatible broker on loopback for the Kafka crate's suite (brokers/kafka):
#   scripts/kafka.sh start|stop|status
# It is Tansu (crates.io: tansu), a broker speaking the Kafka protocol, here with its
# in-memory storage on 127.0.0.1:9092; point the suite at it with KAFKA_URL=127.0.0.1:9092.
# The first start installs Tansu under $TANSU_ROOT (default /opt/tansu) with cargo: about
# 25 minutes of building on two cores, once per machine.
set -euo pipefail

root=${TANSU_ROOT:-/opt/tansu}
version=0.6.0
port=9092
log=${TMPDIR:-/tmp}/diesel-inbox-kafka.log

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
}

install() {
    if [ -x "$root/bin/tansu" ]; then
        return 0
    fi
    echo "kafka: installing tansu $version under $root"
    local target
    target=$(mktemp -d)
    # Its in-memory storage is behind the `dynostore` feature.
    cargo install tansu --version "$version" --features dynostore --locked \
        --root "$root" --target-dir "$target"
    rm -rf "$target"
}

case ${1:-} in
start)
    port_open && exit 0
    install
    setsid "$root/bin/tansu" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine memory://tansu/ </dev/null >"$log" 2>&1 &
    for _ in $(seq 1 60); do
        port_open && exit 0
        sleep 0.5
    done
    echo "kafka: tansu did not come up on 127.0.0.1:$port; see $log" >&2
    exit 1
    ;;
stop)
    pkill -f "$root/bin/tansu broker" || true
    ;;
status)
    if port_open; then echo "kafka: listening on 127.0.0.1:$port"; else echo "kafka: down"; exit 1; fi
    ;;
*)
    echo "usage: $0 start|stop|status" >&2
    exit 2
    ;;
esac
