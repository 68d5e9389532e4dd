# The Airflow image for docker-compose.yaml: Airflow 3.3 with this project's pinned dependencies and library.
FROM python:3.11-slim
ENV AIRFLOW_HOME=/opt/airflow PYTHONUNBUFFERED=1
WORKDIR /opt/eagle3-regen
COPY requirements.txt constraints.txt pyproject.toml ./
COPY include ./include
COPY plugins ./plugins
RUN pip install --no-cache-dir -r requirements.txt -c constraints.txt -e .
COPY dags ./dags
COPY config ./config
COPY data ./data
