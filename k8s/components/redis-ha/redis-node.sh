#!/bin/sh
# Start one Redis data node of the replicated set. Which primary it follows is asked, at every
# start, of the sentinels: after a failover the primary is whichever node they promoted, and a
# node that comes back (restarted, rescheduled) must follow it, not claim the role it had at
# install time. When no sentinel knows a primary (all of them restarting, say) the other data
# nodes are asked which of them is the primary; only when none answers as one (a fresh install)
# is the node named by REDIS_INITIAL_PRIMARY the primary and every other node its replica.
#
# Arguments: the redis-server command line (persistence, password, memory: the StatefulSet's
# args); this script adds the replication flags. Environment: REDIS_PASSWORD;
# REDIS_ANNOUNCE_HOST (this node's stable name) and REDIS_PORT (the port the command line
# serves on); REDIS_INITIAL_PRIMARY (host of the first primary; its port is
# REDIS_INITIAL_PRIMARY_PORT, default REDIS_PORT); SENTINELS ("host:port ..."); SERVICE (the
# name the sentinels monitor); REDIS_NODES (every data node, "host:port ...", this one included).
set -eu
export REDISCLI_AUTH="$REDIS_PASSWORD"
. "$(dirname "$0")/find-primary.sh"

# A replica starts unpromotable (replica-priority 0) and becomes promotable once it has synced:
# a node that comes back holds only what it had when it stopped, a new one nothing, and
# Sentinel, choosing by the offsets it last saw, could otherwise promote it over a replica that
# acknowledged every later write (the gateways' WAIT counts only replicas in sync).
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

if known=$(primary_from_sentinels) \
    || known=$(primary_from_data_nodes "$REDIS_ANNOUNCE_HOST:$REDIS_PORT"); then
  primary_host=${known% *}
  primary_port=${known#* }
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
  set -- "$@" --replicaof "$primary_host" "$primary_port" --replica-priority 0
  promotable_once_synced &
fi
exec "$@"
