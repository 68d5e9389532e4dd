#!/usr/bin/env bash
# What `make demo` and `make test` need from the machine beside Python, checked (and started or installed where this
# machine can) before anything else runs, so that a bare machine fails in seconds with what to do, not minutes later:
#   postgres   PostgreSQL on 127.0.0.1:5432 with trust auth: Airflow's metadata database (demo, e2e tests)
#   redis      Redis on 127.0.0.1:6379: the Celery broker of the distributed e2e test
#   chromium   Debian's headless Chromium: the browser test of the "Drafter data" page
# Usage: tools/prerequisites.sh postgres [redis chromium]
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {  # wait_for PORT NAME
  for _ in $(seq 30); do listening "$1" && return 0; sleep 1; done
  echo "prerequisites: $2 did not start listening on 127.0.0.1:$1" >&2
  exit 1
}

need_postgres() {
  listening 5432 && return 0
  if command -v pg_ctlcluster >/dev/null && [[ -d /etc/postgresql ]]; then
    echo "prerequisites: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start
    wait_for 5432 PostgreSQL
    return 0
  fi
  echo "prerequisites: PostgreSQL is not listening on 127.0.0.1:5432. Install and start it with trust auth for" \
    "local connections (Debian: apt-get install postgresql), then run this again." >&2
  exit 1
}

need_redis() {
  listening 6379 && return 0
  if command -v redis-server >/dev/null; then
    echo "prerequisites: starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no
    wait_for 6379 Redis
    return 0
  fi
  echo "prerequisites: Redis is not listening on 127.0.0.1:6379 (Debian: apt-get install redis-server)." >&2
  exit 1
}

need_chromium() {
  command -v chromium >/dev/null && return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "prerequisites: installing Debian's chromium (the browser test of the Drafter data page)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
    command -v chromium >/dev/null && return 0
  fi
  echo "prerequisites: Chromium is not installed and cannot be installed from here: run" \
    "'sudo apt-get install chromium' (Debian), then run this again." >&2
  exit 1
}

for need in "$@"; do
  case "$need" in
    postgres|redis|chromium) "need_$need" ;;
    *) echo "prerequisites: unknown prerequisite $need" >&2; exit 2 ;;
  esac
done
