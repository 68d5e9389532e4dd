"""Failure notifiers: a failed task says which dataset or shard failed and why, in its log (always) and by mail when
the deployment's config asks for it (`alerts:` in regen.yaml, through an Airflow SMTP connection)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseNotifier

from regen.config import AlertsConfig
from regen.redaction import describe, install_log_redaction, redact

log = logging.getLogger(__name__)

SUBJECT = "eagle3-regen failed: {{ ti.task_id }}{{ ' ' ~ ti.rendered_map_index if ti.rendered_map_index else '' }}"
# HTML: every value escaped (`| e`), whatever the environment's autoescape: an exception carries a server's error
# body, and a run id is whatever its trigger chose. `why` is the exception described (regen.redaction.describe),
# never its repr; the rendered mail is redacted once more before it is sent.
BODY = (
    "<p>DAG {{ dag.dag_id | e }}, run {{ run_id | e }}: task {{ ti.task_id | e }}"
    "{{ (' (' ~ ti.rendered_map_index ~ ')') | e if ti.rendered_map_index else '' }} failed after try"
    " {{ ti.try_number | e }}.</p><p>Why: {{ why | e }}</p><p>{{ advice | e }}</p>"
)


def advice(error: BaseException | None) -> str:
    """What mends the failure: a user error (a conf or config to fix, failed at once and never retried:
    tasks.final_errors_fail_now) is mended by fixing it and triggering again; anything else by clearing the run's
    failed tasks, which resumes with the finished work kept (also for a failure that names the failed tasks it waited
    for: `mended_by_clearing`)."""
    from airflow.sdk.exceptions import AirflowFailException

    if isinstance(error, AirflowFailException) and not getattr(error, "mended_by_clearing", False):
        return (
            "Fix what it names (the run's conf or the deployment's config), then trigger a new run: clearing will "
            "not mend it."
        )
    return "Clear the run's failed tasks to resume; finished work is kept."


def why(error: BaseException | None) -> str:
    """The failure as the alert quotes it: the exception's type and text, redacted (never its repr, which for a
    foreign exception may carry request headers)."""
    return describe(error) if error is not None else "no exception was given"


def failure_message(context: Any) -> str:
    """Which task failed, why, and what to do; redacted (regen.redaction) whatever it quotes."""
    ti = context["ti"]
    what = f"{ti.task_id} [{ti.rendered_map_index}]" if ti.rendered_map_index else ti.task_id
    error = context.get("exception")
    return redact(
        f"eagle3-regen FAILED: {what} in run {ti.run_id} (try {ti.try_number}): {why(error)}. {advice(error)}"
    )


class FailureLog(BaseNotifier):
    """One ERROR line in the failed task's log, where the UI and log shipping find it."""

    def notify(self, context: Any) -> None:
        install_log_redaction()  # where the task's own start did not (a failure before it)
        log.error("%s", failure_message(context))


def failure_notifiers(alerts: AlertsConfig) -> list[BaseNotifier]:
    notifiers: list[BaseNotifier] = [FailureLog()]
    if alerts.email_to:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        class FailureMail(SmtpNotifier):
            """The mail gives the same advice as the log line, and is redacted before it is sent."""

            def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
                context["advice"] = advice(context.get("exception"))
                context["why"] = why(context.get("exception"))
                super().render_template_fields(context, jinja_env)
                self.subject = redact(self.subject) if self.subject else self.subject
                self.html_content = redact(self.html_content) if self.html_content else self.html_content

        notifiers.append(
            FailureMail(to=alerts.email_to, smtp_conn_id=alerts.smtp_conn_id, subject=SUBJECT, html_content=BODY)
        )
    return notifiers
