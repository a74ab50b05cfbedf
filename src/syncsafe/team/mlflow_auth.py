"""The team setup's MLflow server behind its basic-auth app: who may read and write tracked results.

Without authentication any local user (and, on a fleet, any host) could read or rewrite every tracked
result. The server runs as `mlflow server --app-name basic-auth`; `config` writes the app's settings (its
user store on the setup's PostgreSQL, the admin's name and password), which `stack` puts in an owner-only
file named by `MLFLOW_AUTH_CONFIG_PATH`, never on a command line. Two users: the setup's admin, and the one
login every stage process of a DAG task uses (`MLFLOW_TRACKING_USERNAME` / `_PASSWORD` in the Airflow
processes' environment, the only secret `syncsafe.stage_env` passes on). Authenticated users read
everything (`default_permission = READ`); an experiment's creator manages it. An unauthenticated request
is refused (401).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

from syncsafe import localhttp
from syncsafe.team.daemons import TeamError

#: Where the basic-auth app keeps its users and checks a request (MLflow's own names).
AUTH_FUNCTION = "mlflow.server.auth:authenticate_request_basic_auth"
CREATE_USER = "/api/2.0/mlflow/users/create"
UPDATE_PASSWORD = "/api/2.0/mlflow/users/update-password"
GET_USER = "/api/2.0/mlflow/users/get"
#: Seconds a server worker trusts a login it has checked (MLflow's `auth_cache_ttl_seconds`; 0 turns it off).
AUTH_CACHE_TTL_S = 60


def config(users_uri: str, admin: str, admin_password: str) -> str:
    """The basic-auth app's ini file (it holds the admin's password and the user store's URI: owner-only)."""
    return "\n".join([
        "[mlflow]",
        "default_permission = READ",
        f"database_uri = {users_uri}",
        f"admin_username = {admin}",
        f"admin_password = {admin_password}",
        f"authorization_function = {AUTH_FUNCTION}",
        "grant_default_workspace_access = false",
        # a good login is checked against its PBKDF2 hash once a minute per server worker, not on every request
        # (a stage process makes hundreds; each check costs tens of milliseconds of CPU by design). A password
        # changed through the API is refused at once by the worker that changed it, by the others within the TTL.
        f"auth_cache_ttl_seconds = {AUTH_CACHE_TTL_S}",
        "",
    ])  # fmt: skip


def _call(url: str, method: str, path: str, login: tuple[str, str] | None, body: dict | None = None,
          timeout_s: float = 30) -> tuple[int, str]:
    """One request to the server's REST API; returns (status, body) for any HTTP answer."""
    req = urllib.request.Request(url.rstrip("/") + path, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if login is not None:
        token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with localhttp.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - the setup's own URL
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def ensure_user(url: str, admin: tuple[str, str], user: tuple[str, str]) -> None:
    """`user` exists with its password (made on the first `up`, its password set again on a later one)."""
    status, _ = _call(url, "GET", f"{GET_USER}?username={user[0]}", admin)
    if status == 200:
        status, said = _call(url, "PATCH", UPDATE_PASSWORD, admin, {"username": user[0], "password": user[1]})
    else:
        status, said = _call(url, "POST", CREATE_USER, admin, {"username": user[0], "password": user[1]})
    if status != 200:
        raise TeamError(f"the MLflow server at {url} did not take its user {user[0]!r} (HTTP {status}): "
                        f"{said.replace(user[1], '***').replace(admin[1], '***')[-400:]}")


def answers(url: str, login: tuple[str, str] | None) -> int:
    """The HTTP status of a search with `login` (None: without credentials): 200 when let in, 401 when not."""
    return _call(url, "POST", "/api/2.0/mlflow/experiments/search", login, {"max_results": 1})[0]
