#!/bin/sh
# unless-exists FILE COMMAND [ARG...]
# Runs COMMAND unless FILE exists and is not empty: makes one-shot init containers
# (key generation) idempotent across `docker compose up` runs.
set -eu
[ $# -ge 2 ] || { echo "usage: unless-exists FILE COMMAND [ARG...]" >&2; exit 64; }
file=$1
shift
if [ -s "$file" ]; then
  echo "$file exists: nothing to do"
  exit 0
fi
exec "$@"
