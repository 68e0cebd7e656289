#!/usr/bin/env bash
# Local Airflow 3.3 for cdc-lake: SQLite metadata DB, LocalExecutor, low parallelism, the repo's
# dags/ and plugins/ (pipeline DAGs + "CDC pipelines" view). Prints the UI URL and login.
#
#   scripts/airflow_local.sh            # start (or report the running instance)
#   scripts/airflow_local.sh stop       # stop every process it started
#   scripts/airflow_local.sh status     # health JSON + component pids
#   scripts/airflow_local.sh logs       # tails of the component logs
#   scripts/airflow_local.sh airflow dags list   # the Airflow CLI against this instance
#
# Settings (environment):
#   CDC_AIRFLOW_HOME   AIRFLOW_HOME        (default <repo>/.airflow_local; keeps DB, logs, pids)
#   CDC_AIRFLOW_PORT   API/UI port          (default 8080)
#   CDC_AIRFLOW_LOG_PORTS  the scheduler's and triggerer's log servers (default "8793 8794", Airflow's;
#                      "PORT+100 PORT+101" when CDC_AIRFLOW_PORT is one of those); set it to run
#                      a second instance on one machine
#   CDC_AIRFLOW_USER   admin user:password  (default admin:admin; written to a passwords file)
#   CDC_PIPELINES_DIR  pipeline YAML folder (default <repo>/pipelines)
#   CDC_DATA_DIR       landing/lake root used by the pipeline YAML files (their default: <repo>/data)
#   CDC_AIRFLOW_PARALLELISM  task slots    (default 2; the scheduler pre-forks this many workers)
#
# Components run as separate process groups (api-server, scheduler, dag-processor, triggerer);
# pids in $CDC_AIRFLOW_HOME/pids, logs in $CDC_AIRFLOW_HOME/proc-logs. The JWT and API secrets are
# generated once and kept in $CDC_AIRFLOW_HOME/secrets.env (mode 600), so tokens survive restarts.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VIRTUAL_ENV:-$REPO/.venv}"
AIRFLOW="$VENV/bin/airflow"
HOME_DIR="${CDC_AIRFLOW_HOME:-$REPO/.airflow_local}"
PORT="${CDC_AIRFLOW_PORT:-8080}"
if [[ -n "${CDC_AIRFLOW_LOG_PORTS:-}" ]]; then
  read -r WORKER_LOG_PORT TRIGGER_LOG_PORT _ <<< "$CDC_AIRFLOW_LOG_PORTS"
  if ! [[ "$WORKER_LOG_PORT" =~ ^[0-9]+$ && "${TRIGGER_LOG_PORT:-}" =~ ^[0-9]+$ ]]; then
    echo "airflow_local: CDC_AIRFLOW_LOG_PORTS='$CDC_AIRFLOW_LOG_PORTS': expected two port numbers separated by a space, e.g. \"8893 8894\"" >&2
    exit 1
  fi
elif [[ "$PORT" == 8793 || "$PORT" == 8794 ]]; then
  WORKER_LOG_PORT=$((PORT + 100)); TRIGGER_LOG_PORT=$((PORT + 101))
else
  WORKER_LOG_PORT=8793; TRIGGER_LOG_PORT=8794
fi
USER_PASS="${CDC_AIRFLOW_USER:-admin:admin}"
LOGIN="${USER_PASS%%:*}"
PASSWORD="${USER_PASS#*:}"
COMPONENTS=(api-server scheduler dag-processor triggerer)

die() { echo "airflow_local: $*" >&2; exit 1; }

[[ -x "$AIRFLOW" ]] || die "no airflow at $AIRFLOW (create the venv: python -m venv .venv && pip install -c constraints.txt -e '.[dev]')"

pid_alive() { [[ -f "$HOME_DIR/pids/$1.pid" ]] && kill -0 "$(cat "$HOME_DIR/pids/$1.pid")" 2>/dev/null; }

setup_env() {
  mkdir -p "$HOME_DIR/pids" "$HOME_DIR/proc-logs" "$HOME_DIR/logs"
  if [[ ! -f "$HOME_DIR/secrets.env" ]]; then
    (umask 077
     py="$VENV/bin/python"
     {
       echo "export AIRFLOW__API_AUTH__JWT_SECRET='$("$py" -c 'import secrets; print(secrets.token_urlsafe(64))')'"
       echo "export AIRFLOW__API__SECRET_KEY='$("$py" -c 'import secrets; print(secrets.token_hex(32))')'"
     } > "$HOME_DIR/secrets.env")
  fi
  # shellcheck disable=SC1091
  source "$HOME_DIR/secrets.env"
  (umask 077; printf '{"%s": "%s"}\n' "$LOGIN" "$PASSWORD" > "$HOME_DIR/passwords.json")

  # The developer's own AIRFLOW__* settings must not leak into this instance.
  while IFS= read -r var; do
    case "$var" in AIRFLOW__API_AUTH__JWT_SECRET|AIRFLOW__API__SECRET_KEY) ;; *) unset "$var" ;; esac
  done < <(env | sed -n 's/^\(AIRFLOW[A-Z0-9_]*\)=.*/\1/p')

  export AIRFLOW_HOME="$HOME_DIR"
  export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags"
  export AIRFLOW__CORE__PLUGINS_FOLDER="$REPO/plugins"
  export AIRFLOW__CORE__EXECUTOR=LocalExecutor
  export AIRFLOW__CORE__PARALLELISM="${CDC_AIRFLOW_PARALLELISM:-2}"
  export AIRFLOW__CORE__LOAD_EXAMPLES=False
  export AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT=120
  export AIRFLOW__CORE__AUTH_MANAGER=airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager
  export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="$LOGIN:admin"
  export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE="$HOME_DIR/passwords.json"
  export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=False
  # SQLite is one writer at a time: with a backfill created while tasks finish, Airflow can hit
  # "database is locked" and fail a task whose job had committed (tester). For such use set
  # CDC_AIRFLOW_SQL_CONN=postgresql+psycopg2://postgres@127.0.0.1:5432/<db> (database created first).
  export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="${CDC_AIRFLOW_SQL_CONN:-sqlite:///$HOME_DIR/airflow.db}"
  export AIRFLOW__API__HOST=127.0.0.1
  export AIRFLOW__API__PORT="$PORT"
  export AIRFLOW__API__WORKERS=1
  export AIRFLOW__API__BASE_URL="http://127.0.0.1:$PORT/"
  export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$PORT/execution/"
  export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=30
  export AIRFLOW__LOGGING__BASE_LOG_FOLDER="$HOME_DIR/logs"
  # the scheduler's log server took 8793 before the API server could when CDC_AIRFLOW_PORT=8793
  # (tester: "address already in use")
  export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT="$WORKER_LOG_PORT"
  export AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT="$TRIGGER_LOG_PORT"
  export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$VENV/bin:$PATH"
  export CDC_PIPELINES_DIR="${CDC_PIPELINES_DIR:-$REPO/pipelines}"
  [[ -n "${CDC_DATA_DIR:-}" ]] && export CDC_DATA_DIR
  export no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}" NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
}

health() { curl -fsS --max-time 5 "http://127.0.0.1:$PORT/api/v2/monitor/health" 2>/dev/null || true; }

healthy() {
  health | "$VENV/bin/python" -c '
import json, sys
try:
    h = json.load(sys.stdin)
except ValueError:
    sys.exit(1)
ok = all((h.get(c) or {}).get("status") == "healthy" for c in ("metadatabase", "scheduler", "dag_processor"))
sys.exit(0 if ok else 1)'
}

print_login() {
  cat <<EOF
Airflow UI : http://127.0.0.1:$PORT/   (login $LOGIN / $PASSWORD)
CDC view   : http://127.0.0.1:$PORT/plugin/cdc-pipelines   (JSON: /cdc/api/status)
API token  : curl -s -X POST http://127.0.0.1:$PORT/auth/token -H 'Content-Type: application/json' \\
               -d '{"username": "$LOGIN", "password": "$PASSWORD"}'
AIRFLOW_HOME $HOME_DIR   pipelines $CDC_PIPELINES_DIR   logs $HOME_DIR/proc-logs
Stop       : $0 stop
EOF
}

stop() {
  local any=0 c
  for c in "${COMPONENTS[@]}"; do
    local f="$HOME_DIR/pids/$c.pid"
    [[ -f "$f" ]] || continue
    local pid; pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then
      any=1
      # each component was started with setsid: its pid is its process group id
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for _ in $(seq 1 40); do
    local alive=0
    for c in "${COMPONENTS[@]}"; do pid_alive "$c" && alive=1; done
    ((alive)) || break
    sleep 0.5
  done
  for c in "${COMPONENTS[@]}"; do
    if pid_alive "$c"; then
      local pid; pid="$(cat "$HOME_DIR/pids/$c.pid")"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$HOME_DIR/pids/$c.pid"
  done
  ((any)) && echo "airflow_local: stopped" || echo "airflow_local: nothing running"
}

start() {
  setup_env
  local running=0 c
  for c in "${COMPONENTS[@]}"; do pid_alive "$c" && running=1; done
  if ((running)); then
    echo "airflow_local: already running (pids in $HOME_DIR/pids)"; print_login; return 0
  fi
  if [[ "$PORT" == "$WORKER_LOG_PORT" || "$PORT" == "$TRIGGER_LOG_PORT" || "$WORKER_LOG_PORT" == "$TRIGGER_LOG_PORT" ]]; then
    die "ports must differ: API $PORT, log servers $WORKER_LOG_PORT $TRIGGER_LOG_PORT (CDC_AIRFLOW_PORT, CDC_AIRFLOW_LOG_PORTS)"
  fi
  local port what
  for port in "$PORT" "$WORKER_LOG_PORT" "$TRIGGER_LOG_PORT"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      what="the API/UI port; set CDC_AIRFLOW_PORT"
      [[ "$port" != "$PORT" ]] && what="a log server port of the scheduler/triggerer; set CDC_AIRFLOW_LOG_PORTS=\"<port> <port>\""
      die "port $port is in use by another program ($what)"
    fi
  done
  echo "airflow_local: migrating the metadata DB ($HOME_DIR/airflow.db)"
  "$AIRFLOW" db migrate > "$HOME_DIR/proc-logs/db-migrate.log" 2>&1 \
    || { tail -30 "$HOME_DIR/proc-logs/db-migrate.log" >&2; die "airflow db migrate failed"; }
  for c in "${COMPONENTS[@]}"; do
    local args=()
    [[ "$c" == api-server ]] && args=(--host 127.0.0.1 --port "$PORT" --workers 1)
    setsid "$AIRFLOW" "$c" "${args[@]}" >> "$HOME_DIR/proc-logs/$c.log" 2>&1 < /dev/null &
    echo $! > "$HOME_DIR/pids/$c.pid"
  done
  echo -n "airflow_local: waiting for health"
  for _ in $(seq 1 120); do
    if healthy; then echo " ok"; print_login; return 0; fi
    for c in "${COMPONENTS[@]}"; do
      if ! pid_alive "$c"; then
        echo; tail -40 "$HOME_DIR/proc-logs/$c.log" >&2; stop >/dev/null; die "$c exited during start"
      fi
    done
    echo -n "."; sleep 1
  done
  echo; health >&2; echo >&2
  die "not healthy after 120 s; logs in $HOME_DIR/proc-logs (stop with: $0 stop)"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status)
    for c in "${COMPONENTS[@]}"; do
      if pid_alive "$c"; then echo "$c: pid $(cat "$HOME_DIR/pids/$c.pid")"; else echo "$c: not running"; fi
    done
    health; echo ;;
  logs) for f in "$HOME_DIR"/proc-logs/*.log; do echo "--- $f"; tail -25 "$f"; done ;;
  # the Airflow CLI against this instance (its AIRFLOW_HOME, metadata DB and settings); a bare
  # `airflow ...` would use ~/airflow and ask for `airflow db migrate` (docs tester)
  airflow) shift; setup_env; exec "$AIRFLOW" "$@" ;;
  *) die "usage: $0 [start|stop|status|logs|airflow <airflow CLI arguments>]" ;;
esac
