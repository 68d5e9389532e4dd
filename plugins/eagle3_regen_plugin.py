"""eagle3-regen's Airflow plugin: a task process of its DAGs never outlives its supervisor
(regen_airflow.supervision), logs what it cost the machine when it ends (regen_airflow.usage) and pushes its live
series to the config's Pushgateway (regen_airflow.metrics); and the
"Drafter data" page in the UI's navigation (regen_airflow.drafter_ui)."""

from __future__ import annotations

from typing import Any

from airflow.plugins_manager import AirflowPlugin

from regen_airflow import metrics, supervision, usage

DRAFTER_URL = "/drafter"


class _DrafterApp:
    """The page's FastAPI app, imported when the API server mounts it: every Airflow process loads this plugin (the
    task runners for its listener), and only the API server needs the app and Airflow's API auth."""

    def __get__(self, instance: object, owner: type) -> list[dict[str, Any]]:
        from regen_airflow import drafter_ui

        return [{"app": drafter_ui.app, "url_prefix": DRAFTER_URL, "name": "Drafter data"}]


class Eagle3RegenPlugin(AirflowPlugin):
    name = "eagle3_regen"
    listeners = [supervision, usage, metrics]  # noqa: RUF012 (AirflowPlugin declares its lists as class attributes)
    fastapi_apps = _DrafterApp()  # type: ignore[assignment]
    # Shown inside Airflow's UI, in a frame, under "Drafter data" in the navigation.
    external_views = [  # noqa: RUF012
        {"name": "Drafter data", "href": f"{DRAFTER_URL}/", "destination": "nav", "url_route": "drafter-data"}
    ]
