"""Crash points: every mutating storage operation of a small but complete run, failed in turn, and the data checked
after each (SQLite's I/O-error testing, for a storage root).

A run here is the DAG's: its tasks are the pipeline's functions (regen.pipeline) called as the DAG's tasks call them,
in its order and with its trigger rules, each try in a process of its own (forked), retried on failure up to
`task_retries` as Airflow retries it (a FinalError fails at once, as `final_errors_fail_now` makes it). The run:
three datasets (one with tools at two temperatures, one on-policy, one prepared in parts with a gap in its shard
numbers), shards of three samples, groups of two shards, a validation share that holds out prompts of each, on the
local root or on S3 (moto) through the fault proxy.

A crash point is one mutating operation (put, conditional create or replace, delete, conditional delete, file upload,
a claim's timed renewal) of one task's try, named by what it is: its method, its key and its place among the try's
operations on that key (`put_bytes {version}/raw/shard-00000/progress.json@2`), so a point meets the same operation
in every run however the others shift. The try is the task's first, or its second after the first was killed right
after the operation halfway through it or right after its last write before it deletes (a retry's own operations:
stale prompts deleted, leftover checkpoints removed, a claim written again). And one fault:
- before: the operation raises and nothing lands;
- lost_reply: it lands and its reply is lost: on S3 the proxy drops the HTTP reply and botocore retries as it would;
  locally it lands, then raises as a dropped connection does;
- crash: it lands, then the task's process is SIGKILLed at once (no `finally`, no atexit);
- torn (local root, writes): the process is SIGKILLed once its temporary file is written, before the rename.
Then the run goes on as Airflow runs it, and when it ends red, a Resume of its version runs. After it: every
published version passes `regen verify`'s verifier, its records are the fault-free run's split by split (ids and
input_ids), each once, none both published and rejected; latest.json names the run's version and verifies; no
temporary file of a killed writer is left; the run ends green, or red with errors, and the Resume green; and no
answer was asked twice unless the fault hit a generate task: then never one a killed try had checkpointed, and at
most its requests in flight and its unflushed answers a killed try (not counted at a renewal point, whose try's
writes wait for the renewal). A point whose operation no try made fails the harness (after MEET_TRIES runs),
never counts as fired.

With a losing fleet (`--fleet losing`, tools/crash_points/fleet.py) the run faulted is the Resume of a run that went
red past the fleet-loss allowance (max_server_rejected_share), on a fleet mended but for one prompt: it reopens the
finished shards holding fleet losses, asks a shard that failed early for its losses again, and publishes with the
answer still lost listed in fleet-losses.jsonl, so those writes are crash points too; the data is checked against
that Resume's when nothing faults.

    .venv/bin/python -m tools.crash_points --root local --sample 20 --seed 7    # a sample (bench_crashpoints: all)
    .venv/bin/python -m tools.crash_points --root local --fleet losing --match 'fleet-losses|^publish'
"""

from tools.crash_points.checks import write_deployment
from tools.crash_points.harness import Harness, Outcome, harness, outcome_lines, result_line, sample, summary
from tools.crash_points.points import CrashPoint, Operation, parse_point

__all__ = [
    "CrashPoint",
    "Harness",
    "Operation",
    "Outcome",
    "harness",
    "outcome_lines",
    "parse_point",
    "result_line",
    "sample",
    "summary",
    "write_deployment",
]
