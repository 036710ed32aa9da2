# Where the Redis primary is now, for redis-node.sh and sentinel.sh (which source this file).
# Each function prints "host port" and fails when it cannot tell.
#
# Environment: REDISCLI_AUTH (the password); SENTINELS ("host:port ...") and SERVICE (the
# name the sentinels monitor); REDIS_NODES (every data node, "host:port ...").
: "${REDIS_NODES:?must list every data node, host:port ...}"

# The primary the first sentinel that knows one names (the sentinel "host:port" $1 is skipped).
primary_from_sentinels() {
  skip=${1:-}
  for sentinel in $SENTINELS; do
    [ "$sentinel" = "$skip" ] && continue
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

# The primary as the data nodes see it (the node "host:port" $1 is skipped), for when no
# sentinel knows one: every sentinel restarted at once keeps no state, and its install-time
# primary may be a replica by now. Of the nodes that answer ROLE as a primary, the one with the
# most replicas connected, then the highest replication offset (a node that came back empty as
# a primary of nothing loses to the one its peers follow); with no primary answering, the node
# most replicas follow. Fails only when no data node answers as either: a fresh install.
primary_from_data_nodes() {
  skip=${1:-}
  primaries=""
  followed=""
  for node in $REDIS_NODES; do
    [ "$node" = "$skip" ] && continue
    role=$(timeout 3 redis-cli --raw -h "${node%:*}" -p "${node##*:}" role 2>/dev/null) \
      || continue
    case $(echo "$role" | sed -n 1p) in
      master)  # master, offset, then host, port, offset per connected replica
        replicas=$(( ($(echo "$role" | grep -c .) - 2) / 3 ))
        offset=$(echo "$role" | sed -n 2p)
        primaries="$primaries$replicas $offset ${node%:*} ${node##*:}
" ;;
      slave)  # slave, the primary's host and port, link state, offset
        followed="$followed$(echo "$role" | sed -n 2p) $(echo "$role" | sed -n 3p)
" ;;
    esac
  done
  best=$(printf '%s' "$primaries" | sort -k1,1nr -k2,2nr | head -n 1)
  if [ -n "$best" ]; then
    echo "$best" | cut -d' ' -f3,4
    return 0
  fi
  best=$(printf '%s' "$followed" | sort | uniq -c | sort -k1,1nr | head -n 1)
  [ -n "$best" ] || return 1
  echo "$best" | awk '{print $2, $3}'
}
