"""Airflow 3 of the team setup: its configuration, its processes and a small REST client.

Every Airflow process gets the same configuration through ``AIRFLOW__*``
environment variables (:func:`airflow_env`): CeleryExecutor, the Postgres
metadata DB, Redis as broker and Postgres as Celery's result backend, the task
execution API of the api-server (``execution_api_server_url``), one JWT
secret, the simple auth manager with user ``admin`` (password in
``team.json``), the repository's ``dags/``. Scheduled (cron) runs are off
unless asked for: on one machine the nightly DAG runs when triggered.

The workers add ``hostname_callable`` (:mod:`syncsafe.team.hostname`), so each
task instance records which worker (and fleet host) ran it, and skip serving
logs: Airflow's worker log server binds every interface (``[::]`` or
``0.0.0.0``, no setting narrows it) and would be asked for
``http://<task hostname>:8793``; the api-server reads the task logs from
``$AIRFLOW_HOME/logs`` instead, one folder on one machine (on several real
hosts, shared storage or remote logging). So a worker listens on nothing.

The api-server binds ``api_host`` (127.0.0.1, or on a fleet the services
host's address) and every process reaches its execution API there.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from syncsafe import localhttp
from syncsafe.procs import LOOPBACK
from syncsafe.team.daemons import TeamError
from syncsafe.team.hostname import WORKER_ENV

ADMIN = "admin"
#: The Celery workers: name -> (queues, concurrency).
WORKERS = {"cpu": ("default", 2), "gpu": ("gpu", 1)}
GPU_POOL = "gpu"
#: The pool of the study DAG's points (dags/syncsafe_study.py), CPU and GPU together.
STUDY_POOL = "syncsafe_study"


def study_slots(environ: Mapping[str, str]) -> int:
    """The study pool's slots: ``SYNCSAFE_STUDY_CONCURRENCY`` (points of a study run at once), 1 unless set."""
    raw = environ.get("SYNCSAFE_STUDY_CONCURRENCY", "1")
    try:
        slots = int(raw)
    except ValueError:
        slots = 0
    if slots < 1:
        raise TeamError(f"SYNCSAFE_STUDY_CONCURRENCY: expected a whole number of points >= 1, got {raw!r}")
    return slots


def airflow_env(
    *,
    home: Path,
    repo: Path,
    work_dir: Path,
    metadata_url: str,
    broker_url: str,
    api_port: int,
    mlflow_url: str,
    mlflow_login: tuple[str, str] | None,
    secrets: Mapping[str, str],
    scheduled: bool,
    extra: Mapping[str, str] = {},
    api_host: str = LOOPBACK,
) -> dict[str, str]:
    """The environment of every Airflow process (and of the tasks they run)."""
    api = f"http://{api_host}:{api_port}"
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(repo / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__FERNET_KEY": secrets["fernet_key"],
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "AIRFLOW__CELERY__BROKER_URL": broker_url,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + metadata_url,  # the driver named: SQLAlchemy 2.1 defaults to psycopg 3
        "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT": "86400",
        "AIRFLOW__API__HOST": api_host,
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API__BASE_URL": api,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__SECRET_KEY": secrets["api_secret_key"],
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets["jwt_secret"],
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(scheduled),
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        # the DAGs' settings (dags/syncsafe_dag_support.py): this checkout, runs under the state
        # folder, the MLflow server, GPU tasks on the gpu queue and pool, the cpu profile by default
        "SYNCSAFE_REPO": str(repo),
        "SYNCSAFE_WORK_DIR": str(work_dir),
        "MLFLOW_TRACKING_URI": mlflow_url,
        # the stage processes' own login to the MLflow server (its basic-auth app): what syncsafe.stage_env passes on
        **({"MLFLOW_TRACKING_USERNAME": mlflow_login[0], "MLFLOW_TRACKING_PASSWORD": mlflow_login[1]}
           if mlflow_login else {}),
        "SYNCSAFE_TRACKING_STRICT": "1",
        "SYNCSAFE_GPU_QUEUE": "gpu",
        "SYNCSAFE_GPU_POOL": GPU_POOL,
        "SYNCSAFE_STUDY_POOL": STUDY_POOL,
        "SYNCSAFE_NIGHTLY_PROFILE": "cpu",
        **extra,
    }


def worker_env(base: Mapping[str, str], worker: str, src: Path) -> dict[str, str]:
    """A Celery worker's additions: its name in the task instances it runs."""
    return {
        **base,
        WORKER_ENV: worker,
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "syncsafe.team.hostname.worker_hostname",
        "PYTHONPATH": str(src),
    }


def commands(airflow: Path, labels: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """The long-running Airflow processes, by name; ``labels``: each worker's Celery node name
    (default ``<worker>@%h``, %h the machine's name)."""
    labels = labels or {}
    out = {
        "airflow-api-server": [str(airflow), "api-server"],
        "airflow-scheduler": [str(airflow), "scheduler"],
        "airflow-dag-processor": [str(airflow), "dag-processor"],
    }
    for name, (queues, concurrency) in WORKERS.items():
        out[f"airflow-worker-{name}"] = [str(airflow), "celery", "worker", "--queues", queues, "--concurrency",
                                         str(concurrency), "--celery-hostname", labels.get(name, f"{name}@%h"), "--skip-serve-logs",
                                         "--without-gossip", "--without-mingle"]
    return out


class AirflowClient:
    """The public REST API (``/api/v2``) of the api-server, as user ``admin``."""

    def __init__(self, base_url: str, password: str, timeout_s: float = 30.0,
                 call: Callable[..., Any] | None = None) -> None:
        """``call(fn, *args)`` runs each HTTP exchange where the api-server is reachable (on a fleet:
        inside the services host's namespace, :meth:`syncsafe.team.placement.Placement.call`)."""
        self.base = base_url.rstrip("/")
        self.password = password
        self.timeout_s = timeout_s
        self._call = call or (lambda fn, *args: fn(*args))
        self._token = ""

    def _request(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            if not self._token:
                self._token = self._request("POST", "/auth/token", {"username": ADMIN, "password": self.password},
                                            auth=False)["access_token"]
            headers["Authorization"] = f"Bearer {self._token}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            text = self._call(_fetch, req, self.timeout_s)
        except urllib.error.HTTPError as err:
            raise TeamError(f"Airflow {method} {path}: HTTP {err.code}: {err.read().decode()[:500]}") from None
        return json.loads(text) if text else None

    def health(self) -> dict:
        return self._request("GET", "/api/v2/monitor/health", auth=False)

    def dag(self, dag_id: str) -> dict | None:
        try:
            return self._request("GET", f"/api/v2/dags/{dag_id}")
        except TeamError as err:
            if "HTTP 404" in str(err):
                return None
            raise

    def wait_for_dag(self, dag_id: str, timeout_s: float = 300) -> dict:
        """The DAG once the dag-processor has parsed it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = self.dag(dag_id)
            if found is not None:
                return found
            time.sleep(2)
        raise TeamError(f"DAG {dag_id!r} not parsed after {timeout_s:.0f} s (see the dag-processor's log)")

    def pool_slots(self, pool: str) -> int | None:
        """A pool's slots, None when there is no such pool."""
        try:
            return int(self._request("GET", f"/api/v2/pools/{urllib.parse.quote(pool, safe='')}")["slots"])
        except TeamError as err:
            if "404" in str(err):
                return None
            raise

    def unpause(self, dag_id: str) -> None:
        self._request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: Mapping[str, Any]) -> str:
        """Start a DAG run now; returns its run id."""
        run = self._request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": dict(conf)})
        return run["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}")["state"]

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float) -> str:
        """Poll until the run succeeds or fails; its final state."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(3)
        raise TeamError(f"DAG run {dag_id}/{run_id} not finished after {timeout_s:.0f} s")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        """Every task instance of a run (mapped ones one per map index)."""
        out: list[dict] = []
        while True:
            page = self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{_q(run_id)}/taskInstances"
                                        f"?limit=100&offset={len(out)}")
            out += page["task_instances"]
            if not page["task_instances"] or len(out) >= page["total_entries"]:
                return out


def _fetch(req: urllib.request.Request, timeout_s: float) -> str:
    with localhttp.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - the setup's own URL
        return resp.read().decode()


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")
