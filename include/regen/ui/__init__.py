"""The "Drafter data" page's library, Airflow-free: what a storage root holds (`catalog`, with `progress` for the
versions being made and `documents` for the files it reads), the caches in front of it (`caches`) and the page's
HTML (`page`, from `templates/`). The plugin (plugins/regen_airflow/drafter_ui.py) only wires them into Airflow.
"""
