#!/bin/sh
# Start one Redis data node of the replicated set. Which primary it follows is asked, at every
# start, of the sentinels: after a failover the primary is whichever node they promoted, and a
# node that comes back (restarted, rescheduled) must follow it, not claim the role it had at
# install time. Only when no sentinel knows a primary (a fresh install) is the node named by
# REDIS_INITIAL_PRIMARY the primary and every other node its replica.
#
# Arguments: the redis-server command line (persistence, password, memory: the StatefulSet's
# args); this script adds the replication flags. Environment: REDIS_PASSWORD;
# REDIS_ANNOUNCE_HOST (this node's stable name) and REDIS_PORT (the port the command line
# serves on); REDIS_INITIAL_PRIMARY (host of the first primary; its port is
# REDIS_INITIAL_PRIMARY_PORT, default REDIS_PORT); SENTINELS ("host:port ..."); SERVICE (the
# name the sentinels monitor).
set -eu
export REDISCLI_AUTH="$REDIS_PASSWORD"

primary_known_to_sentinels() {
  for sentinel in $SENTINELS; do
    reply=$(timeout 3 redis-cli --raw -h "${sentinel%:*}" -p "${sentinel##*:}" \
      sentinel get-master-addr-by-name "$SERVICE" 2>/dev/null || true)
    host=$(echo "$reply" | sed -n 1p)
    port=$(echo "$reply" | sed -n 2p)
    if [ -n "$host" ] && [ -n "$port" ] && [ "${host#ERR}" = "$host" ]; then
      echo "$host $port"
      return 0
    fi
  done
  return 1
}

# A node that comes back (the sentinels know a primary) starts unpromotable (replica-priority 0)
# and becomes promotable once it has synced: it holds only what it had when it stopped, and
# Sentinel, choosing by the offsets it last saw, could otherwise promote it over a replica that
# acknowledged every later write (the gateways' WAIT counts only replicas in sync). On a fresh
# install every node is empty, so replicas start promotable.
promotable_once_synced() {
  server=$$  # this script's process, which becomes redis-server (exec below)
  until timeout 3 redis-cli --raw -p "$REDIS_PORT" info replication 2>/dev/null \
      | grep -q '^master_link_status:up'; do
    kill -0 "$server" 2>/dev/null || return 0  # the server stopped first
    sleep 1
  done
  timeout 3 redis-cli -p "$REDIS_PORT" config set replica-priority \
    "${REDIS_REPLICA_PRIORITY:-100}" >/dev/null
}

rejoining=no
if known=$(primary_known_to_sentinels); then
  primary_host=${known% *}
  primary_port=${known#* }
  rejoining=yes
else
  primary_host=$REDIS_INITIAL_PRIMARY
  primary_port=${REDIS_INITIAL_PRIMARY_PORT:-$REDIS_PORT}
fi

set -- "$@" --masterauth "$REDIS_PASSWORD" \
  --replica-announce-ip "$REDIS_ANNOUNCE_HOST" --replica-announce-port "$REDIS_PORT"
if [ "$primary_host" = "$REDIS_ANNOUNCE_HOST" ] && [ "$primary_port" = "$REDIS_PORT" ]; then
  echo "starting as the primary"
else
  echo "starting as a replica of $primary_host:$primary_port"
  set -- "$@" --replicaof "$primary_host" "$primary_port"
  if [ "$rejoining" = yes ]; then
    set -- "$@" --replica-priority 0
    promotable_once_synced &
  fi
fi
exec "$@"
