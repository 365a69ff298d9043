#!/bin/sh
# Run by temporalio/admin-tools once the server is healthy: makes sure the namespace and
# Sickbay's Keyword search attributes exist. Idempotent: existing ones are left alone.
set -eu

: "${TEMPORAL_ADDRESS:?TEMPORAL_ADDRESS is required}"
NAMESPACE="${NAMESPACE:-default}"
SEARCH_ATTRIBUTES="${SEARCH_ATTRIBUTES:-}"

tries=0
until temporal operator cluster health --address "$TEMPORAL_ADDRESS" >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -ge 30 ]; then
    echo "Temporal at $TEMPORAL_ADDRESS is not serving after 60 s" >&2
    exit 1
  fi
  sleep 2
done

if temporal operator namespace describe --address "$TEMPORAL_ADDRESS" -n "$NAMESPACE" >/dev/null 2>&1; then
  echo "namespace $NAMESPACE exists"
else
  temporal operator namespace create --address "$TEMPORAL_ADDRESS" -n "$NAMESPACE" --retention 30d
  echo "namespace $NAMESPACE created (retention 30 days: incidents stay inspectable a month)"
fi

existing=$(temporal operator search-attribute list --address "$TEMPORAL_ADDRESS" -n "$NAMESPACE")
for name in $SEARCH_ATTRIBUTES; do
  if printf '%s\n' "$existing" | grep -qw "$name"; then
    echo "search attribute $name exists"
  else
    temporal operator search-attribute create --address "$TEMPORAL_ADDRESS" -n "$NAMESPACE" \
      --name "$name" --type Keyword
    echo "search attribute $name created"
  fi
done
