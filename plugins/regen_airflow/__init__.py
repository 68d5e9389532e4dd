"""Airflow glue for eagle3-regen: connections, fail-now, failure notifiers. Business rules live in `regen`."""
