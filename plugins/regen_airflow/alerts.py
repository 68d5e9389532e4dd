"""Failure notifiers: a failed task says which dataset or shard failed and why, in its log (always) and by mail when
the deployment's config asks for it (`alerts:` in regen.yaml, through an Airflow SMTP connection)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseNotifier

from regen.config import AlertsConfig

log = logging.getLogger(__name__)

SUBJECT = "eagle3-regen failed: {{ ti.task_id }}{{ ' ' ~ ti.rendered_map_index if ti.rendered_map_index else '' }}"
# HTML: every value escaped (`| e`), whatever the environment's autoescape: an exception carries a server's error
# body, and a run id is whatever its trigger chose.
BODY = (
    "<p>DAG {{ dag.dag_id | e }}, run {{ run_id | e }}: task {{ ti.task_id | e }}"
    "{{ (' (' ~ ti.rendered_map_index ~ ')') | e if ti.rendered_map_index else '' }} failed after try"
    " {{ ti.try_number | e }}.</p><p>Why: {{ exception | e }}</p>"
    "<p>Clear the failed tasks of this run to resume; finished work is kept.</p>"
)


def failure_message(context: Any) -> str:
    ti = context["ti"]
    what = f"{ti.task_id} [{ti.rendered_map_index}]" if ti.rendered_map_index else ti.task_id
    return (
        f"eagle3-regen FAILED: {what} in run {ti.run_id} (try {ti.try_number}): {context.get('exception')!r}. "
        "Clear the run's failed tasks to resume; finished work is kept."
    )


class FailureLog(BaseNotifier):
    """One ERROR line in the failed task's log, where the UI and log shipping find it."""

    def notify(self, context: Any) -> None:
        log.error("%s", failure_message(context))


def failure_notifiers(alerts: AlertsConfig) -> list[BaseNotifier]:
    notifiers: list[BaseNotifier] = [FailureLog()]
    if alerts.email_to:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        notifiers.append(
            SmtpNotifier(to=alerts.email_to, smtp_conn_id=alerts.smtp_conn_id, subject=SUBJECT, html_content=BODY)
        )
    return notifiers
