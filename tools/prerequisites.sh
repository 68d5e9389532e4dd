#!/usr/bin/env bash
# What `make demo` and `make test` need from the machine beside Python, checked (and started or installed where this
# machine can) before anything else runs, so that a bare machine fails in seconds with what to do, not minutes later:
#   postgres   PostgreSQL on 127.0.0.1:5432 with trust auth: Airflow's metadata database (demo, e2e tests)
#   redis      Redis on 127.0.0.1:6379: the Celery broker of the distributed e2e test
#   chromium   Debian's headless Chromium: the browser test of the "Drafter data" page
#   prometheus promtool, Prometheus and the Pushgateway (Debian's prometheus and prometheus-pushgateway): the alert
#              rules' tests (monitoring/prometheus) and the live metrics' test. Installed only, never started: the
#              tests start their own on free ports, and a server the package's install started (9090, 9091) is stopped.
# Each is installed from Debian's packages when missing and the user may (root, apt-get), then started. A PostgreSQL
# cluster installed here gets trust auth for TCP connections from 127.0.0.1 and ::1 (as tools/devstack.py connects:
# user postgres, no password); the auth of a cluster the machine already had is never changed.
# Usage: tools/prerequisites.sh postgres [redis chromium prometheus]
# REGEN_PG_PORT, REGEN_REDIS_PORT and REGEN_PG_ETC (default /etc/postgresql) exist for tests/unit/test_prerequisites.py.
set -euo pipefail

PG_PORT=${REGEN_PG_PORT:-5432}
REDIS_PORT=${REGEN_REDIS_PORT:-6379}
PG_ETC=${REGEN_PG_ETC:-/etc/postgresql}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {  # wait_for PORT NAME
  for _ in $(seq 30); do listening "$1" && return 0; sleep 1; done
  echo "prerequisites: $2 did not start listening on 127.0.0.1:$1" >&2
  exit 1
}

may_install() { [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; }

apt_install() {  # apt_install PACKAGE [OPTION...]: quietly; the package lists are updated only when a first try fails
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${@:2}" "$1" >/dev/null 2>&1 && return 0
  apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${@:2}" "$1" >/dev/null 2>&1 && return 0
  echo "prerequisites: 'apt-get install $1' failed: run it to see why, then run this again." >&2
  exit 1
}

pg_cluster() {  # prints the version of the first PostgreSQL cluster named main under $PG_ETC
  local conf version
  for conf in "$PG_ETC"/*/main/pg_hba.conf; do
    [[ -f $conf ]] || continue
    version=${conf#"$PG_ETC"/}
    echo "${version%%/*}"
    return 0
  done
  return 1
}

trust_loopback() {  # trust_loopback PG_HBA: trust auth on the host lines for 127.0.0.1/32 and ::1/128
  local space='[[:space:]]+' field='[^[:space:]]+'
  sed -i -E "s#^(host${space}${field}${space}${field}${space}(127\\.0\\.0\\.1/32|::1/128)${space})${field}#\\1trust#" "$1"
  if ! grep -Eq "^host${space}all${space}all${space}127\\.0\\.0\\.1/32${space}trust" "$1"; then
    echo "prerequisites: could not set trust auth for 127.0.0.1 in $1: set it by hand, then run this again." >&2
    exit 1
  fi
}

need_postgres() {
  listening "$PG_PORT" && return 0
  local version installed=""
  if ! command -v pg_ctlcluster >/dev/null && ! pg_cluster >/dev/null && may_install; then
    echo "prerequisites: installing Debian's postgresql (Airflow's metadata database)"
    apt_install postgresql
    installed=1
  fi
  if command -v pg_ctlcluster >/dev/null && version=$(pg_cluster); then
    if [[ -n $installed ]]; then
      echo "prerequisites: trust auth for 127.0.0.1 and ::1 in the new cluster ($PG_ETC/$version/main/pg_hba.conf)"
      trust_loopback "$PG_ETC/$version/main/pg_hba.conf"
    fi
    if listening "$PG_PORT"; then  # the package started it, with its default auth
      pg_ctlcluster --skip-systemctl-redirect "$version" main reload
    else
      echo "prerequisites: starting PostgreSQL $version"
      pg_ctlcluster --skip-systemctl-redirect "$version" main start
    fi
    wait_for "$PG_PORT" PostgreSQL
    return 0
  fi
  if command -v pg_ctlcluster >/dev/null; then
    echo "prerequisites: PostgreSQL is installed but has no cluster in $PG_ETC: create one (Debian:" \
      "pg_createcluster --start VERSION main) with trust auth for 127.0.0.1, then run this again." >&2
  else
    echo "prerequisites: PostgreSQL is not listening on 127.0.0.1:$PG_PORT. Install it (Debian: 'sudo apt-get" \
      "install postgresql'), with trust auth for 127.0.0.1, then run this again." >&2
  fi
  exit 1
}

need_redis() {
  listening "$REDIS_PORT" && return 0
  if ! command -v redis-server >/dev/null && may_install; then
    echo "prerequisites: installing Debian's redis-server (the Celery broker of the distributed e2e test)"
    apt_install redis-server
    listening "$REDIS_PORT" && return 0  # the package started it
  fi
  if command -v redis-server >/dev/null; then
    echo "prerequisites: starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no >/dev/null
    wait_for "$REDIS_PORT" Redis
    return 0
  fi
  echo "prerequisites: Redis is not listening on 127.0.0.1:$REDIS_PORT. Install it (Debian: 'sudo apt-get install" \
    "redis-server'), then run this again." >&2
  exit 1
}

need_chromium() {
  command -v chromium >/dev/null && return 0
  if may_install; then
    echo "prerequisites: installing Debian's chromium (the browser test of the Drafter data page)"
    apt_install chromium
    command -v chromium >/dev/null && return 0
  fi
  echo "prerequisites: Chromium is not installed and cannot be installed from here: run" \
    "'sudo apt-get install chromium' (Debian), then run this again." >&2
  exit 1
}

prometheus_missing() {  # prints the Debian packages whose commands are not on PATH
  { command -v promtool >/dev/null && command -v prometheus >/dev/null; } || echo prometheus
  command -v prometheus-pushgateway >/dev/null || echo prometheus-pushgateway
}

need_prometheus() {
  local missing package
  missing=$(prometheus_missing)
  [[ -z $missing ]] && return 0
  if may_install; then
    for package in $missing; do
      echo "prerequisites: installing Debian's $package (the tests of the alert rules and of the live metrics)"
      apt_install "$package" --no-install-recommends
      # Its init script or unit may have started a system server (9090, 9091): the tests start their own on free
      # ports, and one left running here would only collide with an operator's. Where nothing started, a no-op.
      service "$package" stop >/dev/null 2>&1 || true
    done
    missing=$(prometheus_missing)
    [[ -z $missing ]] && return 0
  fi
  echo "prerequisites: promtool, prometheus and prometheus-pushgateway are not all installed and cannot be" \
    "installed from here: run 'sudo apt-get install prometheus prometheus-pushgateway' (Debian), then run this" \
    "again." >&2
  exit 1
}

for need in "$@"; do
  case "$need" in
    postgres|redis|chromium|prometheus) "need_$need" ;;
    *) echo "prerequisites: unknown prerequisite $need" >&2; exit 2 ;;
  esac
done
