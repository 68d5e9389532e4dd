"""A task runner of eagle3-regen never outlives its supervisor (regen_airflow.supervision), and the plugin that
arranges it is what Airflow loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

# A "supervisor" forks a "runner" that (when armed) asks to end with its parent, then sleeps; the supervisor exits
# half a second later, as a SIGKILL would end it. The script prints the runner's pid once the supervisor is gone.
ORPHAN = """
import os, sys, time
from regen_airflow.supervision import end_with_parent
supervisor = os.fork()
if supervisor == 0:
    runner = os.fork()
    if runner == 0:
        for fd in (1, 2):  # the pipes to the test stay with the script alone
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        if sys.argv[1] == "armed":
            end_with_parent()
        time.sleep(30)
        os._exit(0)
    print(runner, flush=True)
    time.sleep(0.5)
    os._exit(0)
os.waitpid(supervisor, 0)
time.sleep(0.5)
"""


def orphan_survives(arm: str) -> bool:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "plugins")}
    done = subprocess.run([sys.executable, "-c", ORPHAN, arm], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    try:
        runner = psutil.Process(int(done.stdout))
        alive = runner.status() != psutil.STATUS_ZOMBIE
        runner.kill()
    except psutil.NoSuchProcess:
        alive = False
    return alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_armed_runner_dies_with_its_supervisor_and_an_unarmed_one_lives_on() -> None:
    assert orphan_survives("unarmed")  # what Airflow alone does: the orphan carries on
    assert not orphan_survives("armed")


def test_the_plugin_registers_the_listener_for_task_processes() -> None:
    from airflow.sdk import plugins_manager

    from regen_airflow import supervision

    plugins, _ = plugins_manager._get_plugins()
    assert supervision in [listener for plugin in plugins for listener in plugin.listeners]
