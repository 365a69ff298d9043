#!/bin/sh
# Temporal schema on PostgreSQL, run by temporalio/admin-tools before the server starts.
# Creates each database if it is missing, stamps a fresh one at version 0.0, then applies every
# migration newer than the stored version. Re-running it on a kept volume changes nothing
# (setup-schema does not reset a stamped database; update-schema skips applied versions).
set -eu

: "${POSTGRES_SEEDS:?POSTGRES_SEEDS (the PostgreSQL host) is required}"
: "${POSTGRES_USER:?POSTGRES_USER is required}"
: "${SQL_PASSWORD:?SQL_PASSWORD (read by temporal-sql-tool) is required}"
PORT="${DB_PORT:-5432}"
SCHEMA_ROOT=/etc/temporal/schema/postgresql/v12

sql_tool() {
  temporal-sql-tool --plugin postgres12 --ep "$POSTGRES_SEEDS" -u "$POSTGRES_USER" -p "$PORT" "$@"
}

create_database() {
  # "already exists" is success: the postgres image creates the `temporal` database itself
  # (POSTGRES_USER), and a kept volume has both. Any other failure stops the setup.
  if output=$(sql_tool --db "$1" create 2>&1); then
    echo "created database $1"
  else
    case "$output" in
      *"already exists"*) echo "database $1 already exists" ;;
      *) printf '%s\n' "$output" >&2; echo "cannot create database $1" >&2; exit 1 ;;
    esac
  fi
}

echo "waiting for PostgreSQL at $POSTGRES_SEEDS:$PORT"
tries=0
until nc -z "$POSTGRES_SEEDS" "$PORT"; do
  tries=$((tries + 1))
  if [ "$tries" -ge 30 ]; then
    echo "PostgreSQL at $POSTGRES_SEEDS:$PORT did not answer within 60 s" >&2
    exit 1
  fi
  sleep 2
done

for pair in "temporal:temporal" "temporal_visibility:visibility"; do
  database="${pair%%:*}"
  schema="${pair##*:}"
  create_database "$database"
  sql_tool --db "$database" setup-schema -v 0.0
  sql_tool --db "$database" update-schema -d "$SCHEMA_ROOT/$schema/versioned"
done
echo "Temporal schema is up to date"
