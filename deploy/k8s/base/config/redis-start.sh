#!/bin/sh
# Start redis-server with nitro's ACL users (docs/security.md), used by compose and Kubernetes.
#   nitro-service  the learner and detector: every command on nitro:* keys but the dangerous ones
#   nitro-scaler   the scaler: the same, plus ACL SETUSER/DELUSER/USERS to create and delete each job's
#                  own user (nitro-actor-JOB) for its functions, with a random password, while the job runs
#   default        disabled: a connection without credentials can do nothing
# There is no shared actor user: a job's functions log in as their job's user, with the password their
# invocation's event carries. Passwords come from the environment (NITRO_REDIS_PASSWORD,
# NITRO_REDIS_SCALER_PASSWORD) and go into an ACL file readable only by redis in a memory-backed
# directory, never onto a command line. The rules must equal nitro.data.redis_acl.SERVICE_RULES /
# SCALER_RULES (tests/test_deploy_redis.py).
set -eu
: "${NITRO_REDIS_PASSWORD:?the nitro-service password}"
: "${NITRO_REDIS_SCALER_PASSWORD:?the nitro-scaler password}"
for pw in "$NITRO_REDIS_PASSWORD" "$NITRO_REDIS_SCALER_PASSWORD"; do
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
user nitro-scaler on >$NITRO_REDIS_SCALER_PASSWORD resetkeys ~nitro:* resetchannels -@all +@all -@dangerous +config|get +acl|setuser +acl|deluser +acl|users
ACL
# exec: redis becomes the process that receives SIGTERM and fsyncs the AOF on the way out.
exec "${REDIS_SERVER:-redis-server}" "${1:-/etc/redis/redis.conf}" --aclfile "$acl_dir/users.acl"
