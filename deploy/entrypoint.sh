#!/bin/sh
# The image's one entry point: the same image runs every process of the platform, chosen by the first
# argument. ENTRYPOINT_PRINT=1 prints the command instead of running it (the tests check the mapping).
set -eu
role="${1:-}"
[ $# -gt 0 ] && shift
case "$role" in
  web)       set -- gunicorn controlplane.wsgi --bind "0.0.0.0:${PORT:-8000}" --workers "${WEB_WORKERS:-4}" \
                 --access-logfile - --graceful-timeout 30 "$@" ;;
  worker)    set -- celery -A controlplane worker --loglevel INFO --hostname "worker@%h" "$@" ;;
  # Any number may run: one holds the database lease and sends, the others wait (docs/operations.md).
  scheduler) set -- celery -A controlplane beat --loglevel INFO \
                 --schedule "${BEAT_SCHEDULE_FILE:-/tmp/celerybeat-schedule}" "$@" ;;
  router)    set -- django-admin route "$@" ;;
  gateway)   set -- python -m gateway --host 0.0.0.0 --port "${PORT:-8080}" --workers "${GATEWAY_WORKERS:-1}" "$@" ;;
  migrate)   set -- django-admin migrate --noinput "$@" ;;
  manage)    set -- django-admin "$@" ;;
  *)
    echo "usage: entrypoint.sh web|worker|scheduler|router|gateway|migrate|manage [arguments]" >&2
    exit 64 ;;
esac
if [ "${ENTRYPOINT_PRINT:-}" = 1 ]; then
  echo "$@"
  exit 0
fi
exec "$@"
