"""Airflow reads its configuration at import: point it at a throwaway home before any test imports it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

HOME = os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="regen-airflow-home-"))
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(Path(__file__).resolve().parents[2] / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
# Users of Airflow's simple auth manager, for the API tests of the UI plugin: a viewer may read every DAG's runs.
USERS = {"reader": "reader-password"}
os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] = "reader:viewer"
Path(HOME, "passwords.json").write_text(json.dumps(USERS))
os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] = str(Path(HOME, "passwords.json"))
os.environ.setdefault("AIRFLOW__API_AUTH__JWT_SECRET", os.urandom(32).hex())
