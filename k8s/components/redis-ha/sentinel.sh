#!/bin/sh
# Start one sentinel. It monitors the primary its peers name now (asked at every start, so a
# restarted sentinel does not go back to the install-time primary); when no peer knows one
# (every sentinel restarting at once: they keep no state), the primary the data nodes report;
# only when no data node answers as one (a fresh install), REDIS_INITIAL_PRIMARY.
# Sentinel rewrites its config file as it learns, so the file lives in a writable folder.
#
# Environment: REDIS_PASSWORD (data nodes and sentinels share it); SENTINEL_ANNOUNCE_HOST and
# SENTINEL_PORT; SENTINELS (every sentinel, "host:port ...", this one included); REDIS_NODES
# (every data node, "host:port ..."); REDIS_INITIAL_PRIMARY and REDIS_PORT
# (REDIS_INITIAL_PRIMARY_PORT if it differs); SERVICE; SENTINEL_QUORUM; SENTINEL_DIR;
# SENTINEL_DOWN_AFTER_MS; SENTINEL_FAILOVER_TIMEOUT_MS; SENTINEL_BIND (optional: the
# address to listen on, else all).
set -eu
export REDISCLI_AUTH="$REDIS_PASSWORD"
. "$(dirname "$0")/find-primary.sh"
if known=$(primary_from_sentinels "$SENTINEL_ANNOUNCE_HOST:$SENTINEL_PORT") \
    || known=$(primary_from_data_nodes); then
  primary_host=${known% *}
  primary_port=${known#* }
else
  primary_host=$REDIS_INITIAL_PRIMARY
  primary_port=${REDIS_INITIAL_PRIMARY_PORT:-$REDIS_PORT}
fi
echo "monitoring $primary_host:$primary_port"
config="$SENTINEL_DIR/sentinel.conf"
umask 077
cat > "$config" <<CONF
port $SENTINEL_PORT
${SENTINEL_BIND:+bind $SENTINEL_BIND}
dir $SENTINEL_DIR
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $SENTINEL_ANNOUNCE_HOST
sentinel announce-port $SENTINEL_PORT
requirepass $REDIS_PASSWORD
sentinel sentinel-pass $REDIS_PASSWORD
sentinel monitor $SERVICE $primary_host $primary_port $SENTINEL_QUORUM
sentinel auth-pass $SERVICE $REDIS_PASSWORD
sentinel down-after-milliseconds $SERVICE $SENTINEL_DOWN_AFTER_MS
sentinel failover-timeout $SERVICE $SENTINEL_FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $SERVICE 1
CONF
exec redis-server "$config" --sentinel
