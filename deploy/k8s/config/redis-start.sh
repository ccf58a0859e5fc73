#!/bin/sh
# Start redis-server with nitro's ACL users (docs/security.md), used by compose and Kubernetes.
#   nitro-service  the learner, detector and scaler: every command on nitro:* keys but the dangerous ones
#   nitro-actor    actor and learner functions: XADD trajectories/updates, GET policies, nothing else
#   default        disabled: a connection without credentials can do nothing
# Passwords come from the environment (NITRO_REDIS_PASSWORD, NITRO_REDIS_ACTOR_PASSWORD) and go
# into an ACL file readable only by redis in a memory-backed directory, never onto a command line.
# The rules must equal nitro.local.redis_server.SERVICE_RULES / ACTOR_RULES (tests/test_deploy_redis.py).
set -eu
: "${NITRO_REDIS_PASSWORD:?the nitro-service password}"
: "${NITRO_REDIS_ACTOR_PASSWORD:?the nitro-actor password}"
for pw in "$NITRO_REDIS_PASSWORD" "$NITRO_REDIS_ACTOR_PASSWORD"; do
    case "$pw" in
        *[!A-Za-z0-9._~+/=-]*) echo "redis-start: passwords must be [A-Za-z0-9._~+/=-] (use hex)" >&2; exit 2 ;;
    esac
done
acl_dir="${NITRO_REDIS_ACL_DIR:-/run/nitro-redis}"
umask 077
mkdir -p "$acl_dir"
cat > "$acl_dir/users.acl" <<ACL
user default off resetpass resetkeys resetchannels -@all
user nitro-service on >$NITRO_REDIS_PASSWORD resetkeys ~nitro:* resetchannels -@all +@all -@dangerous +config|get
user nitro-actor on >$NITRO_REDIS_ACTOR_PASSWORD resetkeys ~nitro:*:traj ~nitro:*:policy:* ~nitro:*:learn:* resetchannels -@all +xadd +get +ping +auth +hello +multi +exec +discard
ACL
# exec: redis becomes the process that receives SIGTERM and fsyncs the AOF on the way out.
exec "${REDIS_SERVER:-redis-server}" "${1:-/etc/redis/redis.conf}" --aclfile "$acl_dir/users.acl"
