#!/usr/bin/env bash
# kafka-topics.sh for librdkafka's test suite, on weir's own CLI (`weir topic ...`).
#
# librdkafka's tests call $KAFKA_PATH/bin/kafka-topics.sh (test_kafka_topics) to make topics
# the Admin API of old brokers could not, e.g. with --config message.timestamp.type=...
# (0052). librdkafka.sh points KAFKA_PATH at this folder and WEIR_BIN at a weir binary.
# Only the forms the suite uses are understood; anything else exits 2, naming it:
#   --bootstrap-server B --create --topic T [--partitions N] [--replication-factor R] [--config K=V]...
#   --bootstrap-server B --alter  --topic T --partitions N
#   --bootstrap-server B --delete --topic T
set -euo pipefail
weir="${WEIR_BIN:?kafka-topics.sh (weir shim): WEIR_BIN must name the weir binary}"
boot="" action="" topic="" parts="" rf=""
configs=()
while [ $# -gt 0 ]; do
    case "$1" in
        --bootstrap-server) boot="${2:?}"; shift 2 ;;
        --create|--alter|--delete) action="${1#--}"; shift ;;
        --topic) topic="${2:?}"; shift 2 ;;
        --partitions) parts="${2:?}"; shift 2 ;;
        --replication-factor) rf="${2:?}"; shift 2 ;;
        --config) configs+=(--config "${2:?}"); shift 2 ;;
        *) echo "kafka-topics.sh (weir shim): unsupported argument '$1'" >&2; exit 2 ;;
    esac
done
[ -n "$boot" ] && [ -n "$topic" ] && [ -n "$action" ] \
    || { echo "kafka-topics.sh (weir shim): need --bootstrap-server, --topic and an action" >&2; exit 2; }
case "$action" in
    create)
        exec "$weir" topic create "$topic" --bootstrap-server "$boot" \
            ${parts:+--partitions "$parts"} ${rf:+--replication-factor "$rf"} "${configs[@]}" ;;
    alter)
        [ -n "$parts" ] && [ "${#configs[@]}" = 0 ] \
            || { echo "kafka-topics.sh (weir shim): --alter takes --partitions only" >&2; exit 2; }
        exec "$weir" topic alter "$topic" --bootstrap-server "$boot" --partitions "$parts" ;;
    delete)
        exec "$weir" topic delete "$topic" --bootstrap-server "$boot" ;;
esac
