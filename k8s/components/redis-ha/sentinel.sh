#!/bin/sh
# Start one sentinel. It monitors the primary its peers name now (asked at every start, so a
# restarted sentinel does not go back to the install-time primary), else REDIS_INITIAL_PRIMARY.
# Sentinel rewrites its config file as it learns, so the file lives in a writable folder.
#
# Environment: REDIS_PASSWORD (data nodes and sentinels share it); SENTINEL_ANNOUNCE_HOST and
# SENTINEL_PORT; SENTINELS (every sentinel, "host:port ...", this one included);
# REDIS_INITIAL_PRIMARY and REDIS_PORT (REDIS_INITIAL_PRIMARY_PORT if it differs); SERVICE; SENTINEL_QUORUM; SENTINEL_DIR;
# SENTINEL_DOWN_AFTER_MS; SENTINEL_FAILOVER_TIMEOUT_MS; SENTINEL_BIND (optional: the
# address to listen on, else all).
set -eu
export REDISCLI_AUTH="$REDIS_PASSWORD"
self="$SENTINEL_ANNOUNCE_HOST:$SENTINEL_PORT"
primary_host=$REDIS_INITIAL_PRIMARY
primary_port=${REDIS_INITIAL_PRIMARY_PORT:-$REDIS_PORT}
for sentinel in $SENTINELS; do
  [ "$sentinel" = "$self" ] && continue
  reply=$(timeout 3 redis-cli --raw -h "${sentinel%:*}" -p "${sentinel##*:}" \
    sentinel get-master-addr-by-name "$SERVICE" 2>/dev/null || true)
  host=$(echo "$reply" | sed -n 1p)
  port=$(echo "$reply" | sed -n 2p)
  if [ -n "$host" ] && [ -n "$port" ] && [ "${host#ERR}" = "$host" ]; then
    primary_host=$host
    primary_port=$port
    break
  fi
done
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
