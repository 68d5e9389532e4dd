"""tools/prerequisites.sh on a bare Debian machine: PostgreSQL and Redis installed from Debian's packages when the user
may (root, apt-get), a new cluster given trust auth for loopback TCP, both started; Prometheus's binaries installed
and left stopped; otherwise one line saying what to run. No real install: the script runs with a PATH of stubs
(apt-get, id, pg_ctlcluster, redis-server, service) that record their calls and, where they "start" a server, listen
on a free port the script is pointed at (REGEN_PG_PORT, REGEN_REDIS_PORT), so the machine's own PostgreSQL, Redis and
/etc/postgresql (REGEN_PG_ETC) are never touched."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.devstack import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "prerequisites.sh"
BASH = shutil.which("bash") or "/bin/bash"
BASICS = ("seq", "sleep", "sed", "grep")  # all the script runs beside the stubs and bash's builtins

# Debian's pg_hba.conf as `apt-get install postgresql` writes it for the new cluster main.
DEBIAN_PG_HBA = """\
local   all             postgres                                peer
# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     peer
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     peer
host    replication     all             127.0.0.1/32            scram-sha-256
host    replication     all             ::1/128                 scram-sha-256
"""

LISTENER = """\
import os, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
child = os.fork()
if child:  # returns once listening, as a server's start command does; the child serves
    with open(sys.argv[2], "a") as pids:
        pids.write(f"{child}\\n")
    sys.exit(0)
s.settimeout(60)  # gone a minute after its last connection, should a test fail to stop it
while True:
    try:
        s.accept()[0].close()
    except socket.timeout:
        break
"""


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Machine:
    """A tmp dir standing in for the machine: bin/ is the script's whole PATH, log has one line per stub call."""

    tmp: Path
    pg_port: int
    redis_port: int

    @property
    def bin(self) -> Path:
        return self.tmp / "bin"

    @property
    def pg_etc(self) -> Path:
        return self.tmp / "etc" / "postgresql"

    @property
    def log(self) -> Path:
        return self.tmp / "calls.log"

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def stub(self, name: str, body: str = "", *, where: Path | None = None) -> None:
        """A bash stub that logs its name and arguments, then runs body (with the real PATH, for cp, touch...)."""
        path = (where or self.bin) / name
        path.write_text(
            f'#!{BASH}\nPATH=/usr/local/bin:/usr/bin:/bin\necho "{name} $*" >> {self.log}\nT={self.tmp}\n'
            f"listen() {{ {sys.executable} $T/listener.py $1 $T/pids </dev/null >/dev/null 2>&1; }}\n"
            f"{body}\n"
        )
        path.chmod(0o755)

    def root(self, uid: int = 0) -> None:
        self.stub("id", f"echo {uid}")

    def apt_get(self, *, stale_lists: bool = False, package_starts: bool = False) -> None:
        """Debian's apt-get: `install postgresql` creates cluster 16/main and puts pg_ctlcluster on PATH (and, with
        package_starts, starts it as the package's init script does); `install redis-server` puts redis-server on
        PATH; `install prometheus` promtool and prometheus, `install prometheus-pushgateway` prometheus-pushgateway.
        With stale_lists, an install fails until `apt-get update` has run."""
        self.stub(
            "pg_ctlcluster", 'if [[ ${@: -1} == start ]]; then listen "$REGEN_PG_PORT"; fi', where=self.tmp / "pkg"
        )
        self.stub(
            "redis-server",
            'while (($#)); do [[ $1 == --port ]] && listen "$2"; shift; done',
            where=self.tmp / "pkg",
        )
        for binary in ("promtool", "prometheus", "prometheus-pushgateway"):
            self.stub(binary, where=self.tmp / "pkg")
        (self.tmp / "debian-pg_hba.conf").write_text(DEBIAN_PG_HBA)
        stale = "[[ -e $T/updated ]] || exit 100" if stale_lists else ""
        start = 'listen "$REGEN_PG_PORT"' if package_starts else ""
        self.stub(
            "apt-get",
            f"""
            case "$1" in
              update) touch $T/updated; exit 0 ;;
              install) {stale}
                case "${{@: -1}}" in
                  postgresql)
                    mkdir -p {self.pg_etc}/16/main && cp $T/debian-pg_hba.conf {self.pg_etc}/16/main/pg_hba.conf
                    cp $T/pkg/pg_ctlcluster {self.bin}/
                    {start} ;;
                  redis-server) cp $T/pkg/redis-server {self.bin}/ ;;
                  prometheus) cp $T/pkg/promtool $T/pkg/prometheus {self.bin}/ ;;
                  prometheus-pushgateway) cp $T/pkg/prometheus-pushgateway {self.bin}/ ;;
                  *) exit 100 ;;
                esac ;;
            esac
            """,
        )

    def run(self, *needs: str) -> tuple[subprocess.CompletedProcess[str], float]:
        env = {
            "PATH": str(self.bin),
            "HOME": str(self.tmp),
            "REGEN_PG_PORT": str(self.pg_port),
            "REGEN_REDIS_PORT": str(self.redis_port),
            "REGEN_PG_ETC": str(self.pg_etc),
        }
        start = time.monotonic()
        done = subprocess.run(
            [BASH, str(SCRIPT), *needs], env=env, capture_output=True, text=True, timeout=90, check=False
        )
        return done, time.monotonic() - start


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    for sub in ("bin", "pkg"):
        (tmp_path / sub).mkdir()
    for tool in BASICS:
        real = shutil.which(tool)
        assert real, f"{tool} is needed to run tools/prerequisites.sh"
        (tmp_path / "bin" / tool).symlink_to(real)
    (tmp_path / "listener.py").write_text(LISTENER)
    yield Machine(tmp_path, free_port(), free_port())
    pids = tmp_path / "pids"
    for pid in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGTERM)


def test_a_bare_machine_as_root_gets_postgresql_and_redis_installed_trusted_and_started(machine: Machine) -> None:
    machine.root()
    machine.apt_get()
    done, _ = machine.run("postgres", "redis")
    assert done.returncode == 0, done.stderr
    calls = machine.calls()
    assert "apt-get install -y -q postgresql" in calls
    assert "pg_ctlcluster --skip-systemctl-redirect 16 main start" in calls
    assert "apt-get install -y -q redis-server" in calls
    assert any(
        c.startswith(f"redis-server --daemonize yes --bind 127.0.0.1 --port {machine.redis_port} ") for c in calls
    )
    assert not any(c.startswith("apt-get update") for c in calls)  # the lists are updated only when an install fails
    assert listening(machine.pg_port) and listening(machine.redis_port)
    hba = (machine.pg_etc / "16" / "main" / "pg_hba.conf").read_text().splitlines()
    hosts = [line.split() for line in hba if line.startswith("host")]
    assert len(hosts) == 4 and all(fields[-1] == "trust" for fields in hosts)
    assert [line for line in hba if not line.startswith("host")] == [
        line for line in DEBIAN_PG_HBA.splitlines() if not line.startswith("host")
    ]


def test_stale_package_lists_are_updated_once_an_install_fails(machine: Machine) -> None:
    machine.root()
    machine.apt_get(stale_lists=True)
    done, _ = machine.run("postgres")
    assert done.returncode == 0, done.stderr
    apt = [c for c in machine.calls() if c.startswith("apt-get")]
    assert apt == ["apt-get install -y -q postgresql", "apt-get update -q", "apt-get install -y -q postgresql"]


def test_a_cluster_the_package_started_is_reloaded_with_trust_auth(machine: Machine) -> None:
    machine.root()
    machine.apt_get(package_starts=True)
    done, _ = machine.run("postgres")
    assert done.returncode == 0, done.stderr
    calls = machine.calls()
    assert "pg_ctlcluster --skip-systemctl-redirect 16 main reload" in calls
    assert not any(c.endswith(" start") for c in calls)
    assert "127.0.0.1/32            trust" in (machine.pg_etc / "16" / "main" / "pg_hba.conf").read_text()


@pytest.mark.parametrize("why", ["not root", "no apt-get"])
def test_without_root_or_apt_get_it_fails_in_seconds_saying_what_to_run(machine: Machine, why: str) -> None:
    machine.root(uid=1000 if why == "not root" else 0)
    if why == "not root":
        machine.apt_get()
    done, seconds = machine.run("postgres", "redis")
    assert done.returncode != 0
    assert seconds < 10
    assert "apt-get install postgresql" in done.stderr
    assert not any(c.startswith("apt-get") for c in machine.calls())
    assert not machine.pg_etc.exists()


def test_redis_alone_names_its_package_when_it_cannot_be_installed(machine: Machine) -> None:
    machine.root(uid=1000)
    done, _ = machine.run("redis")
    assert done.returncode != 0
    assert "apt-get install redis-server" in done.stderr


def test_an_installed_cluster_that_is_not_running_is_started_and_its_auth_left_alone(machine: Machine) -> None:
    machine.root()
    machine.apt_get()
    shutil.copy(machine.tmp / "pkg" / "pg_ctlcluster", machine.bin / "pg_ctlcluster")
    hba = machine.pg_etc / "15" / "main" / "pg_hba.conf"
    hba.parent.mkdir(parents=True)
    hba.write_text(DEBIAN_PG_HBA)
    done, _ = machine.run("postgres")
    assert done.returncode == 0, done.stderr
    assert machine.calls() == ["pg_ctlcluster --skip-systemctl-redirect 15 main start"]
    assert hba.read_text() == DEBIAN_PG_HBA


def test_servers_already_listening_call_nothing(machine: Machine) -> None:
    machine.root()
    machine.apt_get()
    servers = [socket.create_server(("127.0.0.1", port)) for port in (machine.pg_port, machine.redis_port)]
    try:
        done, _ = machine.run("postgres", "redis")
    finally:
        for server in servers:
            server.close()
    assert done.returncode == 0, done.stderr
    assert machine.calls() == []
    assert done.stdout == ""


def test_prometheus_is_installed_without_recommends_and_what_the_package_started_is_stopped(machine: Machine) -> None:
    machine.root()
    machine.apt_get()
    machine.stub("service")
    for _ in range(2):  # the second run finds it all installed
        done, _ = machine.run("prometheus")
        assert done.returncode == 0, done.stderr
    assert [c for c in machine.calls() if c != "id -u"] == [
        "apt-get install -y -q --no-install-recommends prometheus",
        "service prometheus stop",
        "apt-get install -y -q --no-install-recommends prometheus-pushgateway",
        "service prometheus-pushgateway stop",
    ]


def test_prometheus_names_its_packages_when_it_cannot_be_installed(machine: Machine) -> None:
    machine.root(uid=1000)
    machine.apt_get()
    done, _ = machine.run("prometheus")
    assert done.returncode != 0
    assert "apt-get install prometheus prometheus-pushgateway" in done.stderr
    assert not any(c.startswith("apt-get") for c in machine.calls())
