#!/usr/bin/env bash
# CI entry point: make sure the services the tests use are up, then run the
# README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."

up() { # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

wait_for() { # name host port
  for _ in $(seq 1 60); do
    if up "$2" "$3"; then return 0; fi
    sleep 1
  done
  echo "ci: $1 did not come up on $2:$3" >&2
  return 1
}

# Prometheus and promtool for the metrics tests (tests/fleet/observability/prometheus.rs
# starts its own private Prometheus; the package's system service is not
# started).
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "ci: installing Prometheus"
  (apt-get install -y prometheus || (apt-get update && apt-get install -y prometheus)) >/dev/null
fi

if ! up 127.0.0.1 5432; then
  echo "ci: starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
if ! up 127.0.0.1 6379; then
  echo "ci: starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
fi
if ! up 127.0.0.1 5672; then
  echo "ci: starting RabbitMQ"
  rabbitmq-server -detached || true
fi
wait_for PostgreSQL 127.0.0.1 5432
wait_for Redis 127.0.0.1 6379
wait_for RabbitMQ 127.0.0.1 5672

# schemathesis for the property-based API test (dispatcher/tests/schemathesis.rs):
# pinned with hashes (.ci/requirements-schemathesis.txt, compiled from the .in
# file with pip-compile --generate-hashes) in a venv under the project; the test
# fails instead of skipping when it is missing.
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "ci: installing Python"
  (apt-get install -y python3 python3-venv || (apt-get update && apt-get install -y python3 python3-venv)) >/dev/null
fi
[ -x .ci/venv/bin/pip ] || python3 -m venv .ci/venv
.ci/venv/bin/pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r .ci/requirements-schemathesis.txt
export GLIA_REQUIRE_SCHEMATHESIS=1

# Chromium and chromedriver for the inbox browser test (tests/fleet/approvals/inbox_browser.rs).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  echo "ci: installing chromium and chromium-driver"
  (apt-get install -y chromium chromium-driver || (apt-get update && apt-get install -y chromium chromium-driver)) >/dev/null
fi

# Real MCP servers for the MCP tests (worker/tests/mcp.rs, tests/fleet/exactly_once/mcp_tools.rs):
# @modelcontextprotocol/server-everything and server-filesystem, pinned in
# .ci/mcp/package-lock.json. `npm ci` when they are not installed yet (an
# offline machine that has them goes on); the tests fail instead of
# skipping when they are missing.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "ci: installing Node.js"
  (apt-get install -y nodejs npm || (apt-get update && apt-get install -y nodejs npm)) >/dev/null
fi
if [ ! -f .ci/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js ] \
  || [ ! -f .ci/mcp/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js ] \
  || ! cmp -s .ci/mcp/package-lock.json .ci/mcp/node_modules/.package-lock.json.ci 2>/dev/null; then
  echo "ci: installing the MCP test servers (npm ci --prefix .ci/mcp)"
  npm ci --prefix .ci/mcp --no-audit --no-fund --loglevel=error
  cp .ci/mcp/package-lock.json .ci/mcp/node_modules/.package-lock.json.ci
fi
export GLIA_REQUIRE_MCP=1

# The README's test command:
