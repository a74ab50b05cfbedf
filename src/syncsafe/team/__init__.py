"""The team setup on one machine or across fleet hosts: real PostgreSQL, Redis, an MLflow server and
Airflow with Celery.

``scripts/team.sh up|down|status|trigger`` (``python -m syncsafe.team``) starts,
on 127.0.0.1 only (or, with ``up --fleet NAME``, spread over a fleet's hosts,
each service bound to its host's address: :mod:`syncsafe.team.placement`) and
from Debian's packages and the project's environments:

- PostgreSQL: a private cluster under the state folder (``initdb``/``pg_ctl``,
  run as the ``postgres`` system user when started as root), with the
  databases ``airflow`` (Airflow's metadata DB and Celery's result backend)
  and ``mlflow`` (the MLflow server's backend store);
- Redis: Celery's broker;
- ``mlflow server`` from ``.venv``, serving artifacts from the state folder;
- Airflow 3 from ``.venv-airflow`` with the CeleryExecutor: ``api-server``
  (UI, REST API and the task execution API), ``scheduler``,
  ``dag-processor`` and two Celery workers, ``cpu`` on the ``default`` queue
  and ``gpu`` on the ``gpu`` queue (the queue of ``train`` and
  ``replay_vllm``). Each worker records its name in the task instances it
  runs (``hostname`` ``cpu@<host>`` / ``gpu@<host>``).

``down`` stops every process it started, with their children, and checks that
no process or listening port is left. The state folder (default ``.team/`` in
the checkout, gitignored; ``--dir`` or ``SYNCSAFE_TEAM_DIR``) keeps the
cluster, the logs, the DAG runs' folders and ``team.json`` (ports, secrets,
process ids), so a second ``up`` continues with the same history.

This package's ``__init__`` imports nothing: :mod:`syncsafe.team.hostname`
is loaded by the Airflow workers from their own environment.
"""
