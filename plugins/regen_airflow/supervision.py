"""A task process ends with its supervisor.

Airflow runs each task in a task-runner process forked by a supervisor, which heartbeats for it. When the supervisor
is killed, the runner is orphaned and carries on: a shard task would keep sending requests and writing checkpoints
while the scheduler, once the heartbeat timeout has passed, starts a retry of the same shard beside it. So every
eagle3-regen task asks the kernel (Linux `PR_SET_PDEATHSIG`) to SIGKILL its runner the moment the supervisor dies:
the orphan stops at once, exactly as a killed runner does, and the retry resumes from its checkpoints alone. The
scheduler still learns of the death only by the missing heartbeats (`[scheduler] task_instance_heartbeat_timeout`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DAG_IDS = frozenset({"eagle3_regen", "eagle3_training_handoff"})


def end_with_parent() -> bool:
    """SIGKILL this process when its parent dies; True when the kernel took the request (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return False
    if os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return True


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    if task_instance.dag_id in DAG_IDS:
        end_with_parent()
