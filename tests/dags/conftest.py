"""Airflow reads its configuration at import: point it at a throwaway home before any test imports it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="regen-airflow-home-"))
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(Path(__file__).resolve().parents[2] / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
