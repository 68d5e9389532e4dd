"""eagle3-regen's Airflow plugin: a task process of its DAGs never outlives its supervisor
(regen_airflow.supervision)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from regen_airflow import supervision


class Eagle3RegenPlugin(AirflowPlugin):
    name = "eagle3_regen"
    listeners = [supervision]  # noqa: RUF012 (AirflowPlugin declares its lists as class attributes)
