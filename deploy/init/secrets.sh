#!/bin/sh
# Generates the compose stack's secrets into DIR (the named volume `secrets`) on the first
# `docker compose up`, so nothing that works as a key is ever committed; later runs keep them.
# Run by the one-shot `init` service (alpine, as root) before every service that reads them,
# and by tools/compose's test.
#
#   secrets.sh DIR [RUNDIR]
#
# Every secret is 32 random bytes as 64 hex digits, with no trailing newline (Grafana's
# __FILE variables take the file verbatim). redis.conf carries redis_password as requirepass,
# since redis-server reads no password file. Run as root, each file is made readable by the
# one user that needs it (mode 0400): rollout (uid 10001, the Dockerfile's) for the servers'
# and the loop's files, redis (999, the redis image's) for redis.conf, grafana (472, the
# grafana image's) for its admin password; the Redis health check runs as root. RUNDIR, the
# loop's run volume, is handed to rollout so that the loop can write to it.
set -eu

dir=${1:?usage: secrets.sh DIR [RUNDIR]}
run=${2:-}
umask 077
mkdir -p "$dir"

# rand prints 32 bytes from the kernel's CSPRNG as hex.
rand() { head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n'; }

# secret NAME writes DIR/NAME unless it holds a value already; through a rename, so a reader
# never sees a half-written file and an interrupted run leaves no empty one.
secret() {
	if [ ! -s "$dir/$1" ]; then
		rand >"$dir/.$1.tmp"
		mv "$dir/.$1.tmp" "$dir/$1"
	fi
}

for name in fleet_secret admin_token api_key redis_password grafana_admin_password; do
	secret "$name"
done
# Rewritten every time from redis_password, so the two cannot disagree.
printf 'requirepass %s\n' "$(cat "$dir/redis_password")" >"$dir/.redis.conf.tmp"
mv "$dir/.redis.conf.tmp" "$dir/redis.conf"

chmod 0400 "$dir/fleet_secret" "$dir/admin_token" "$dir/api_key" "$dir/redis_password" \
	"$dir/grafana_admin_password" "$dir/redis.conf"
chmod 0755 "$dir"
if [ "$(id -u)" = 0 ]; then
	chown 10001:10001 "$dir/fleet_secret" "$dir/admin_token" "$dir/api_key" "$dir/redis_password"
	chown 999:999 "$dir/redis.conf"
	chown 472:0 "$dir/grafana_admin_password"
	if [ -n "$run" ]; then
		mkdir -p "$run"
		chown 10001:10001 "$run"
	fi
fi
echo "secrets.sh: secrets ready in $dir"
