#!/usr/bin/env bash
# Register a model version, post its evaluation, and promote it, from any CI system. Needs bash and curl.
#
#   CONTROLPLANE_URL   e.g. https://cp.example.com
#   CONTROLPLANE_TOKEN a robot token with tenants:read, registry:read, registry:write, registry:promote
#   MODEL              owner/name, e.g. acme-eu/llama-3-8b (owner "platform" for catalog models)
#   MODEL_FILE         optional: JSON body of the model (see docs/ci/model.json), created if MODEL is missing
#   VERSION_FILE       JSON body of the version (see docs/registry.md), including "version"
#   REPORT_FILE        JSON body of the validation report: {"metrics": {...}, "performance": {...}, "hardware": {...}}
#   PROMOTE_TO         last state to reach: validated, staged, canary (default) or production
#   OVERRIDE_REASON    required for production while canary analysis is not automated (tenant-admin robot)
#
# Every POST carries an Idempotency-Key derived from the version, so re-running a pipeline is safe.
set -euo pipefail

: "${CONTROLPLANE_URL:?}" "${CONTROLPLANE_TOKEN:?}" "${MODEL:?}" "${VERSION_FILE:?}" "${REPORT_FILE:?}"
PROMOTE_TO="${PROMOTE_TO:-canary}"
API="${CONTROLPLANE_URL%/}/api/v1/models/${MODEL}"
VERSION=$(grep -o '"version"[[:space:]]*:[[:space:]]*"[^"]*"' "$VERSION_FILE" | head -n1 | sed 's/.*"\([^"]*\)"$/\1/')
[ -n "$VERSION" ] || { echo "VERSION_FILE has no \"version\"" >&2; exit 2; }

call() {  # call METHOD PATH STEP [BODY-FILE|JSON]: prints the body, fails with the error envelope on 4xx/5xx
  local method=$1 path=$2 step=$3 body=${4:-}
  [ "${path:0:1}" = / ] && path="${API}${path}"
  local args=(-sS --fail-with-body -X "$method" -H "Authorization: Bearer ${CONTROLPLANE_TOKEN}"
              -H "Content-Type: application/json" -H "Idempotency-Key: ci-${MODEL}-${VERSION}-${step}")
  if [ -f "$body" ]; then args+=(--data-binary "@${body}"); elif [ -n "$body" ]; then args+=(--data "$body"); fi
  local out
  if ! out=$(curl "${args[@]}" "${path}"); then
    printf '%s\nstep %s failed\n' "$out" "$step" >&2
    exit 1
  fi
  printf '%s' "$out"
}

status() { grep -o '"status"[[:space:]]*:[[:space:]]*"[^"]*"' | head -n1 | sed 's/.*"\([^"]*\)"$/\1/'; }

if [ -n "${MODEL_FILE:-}" ]; then  # create the model on the first run; later runs find it
  found=$(curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${CONTROLPLANE_TOKEN}" "${API}/")
  if [ "$found" = 404 ]; then
    call POST "${CONTROLPLANE_URL%/}/api/v1/models/" model "$MODEL_FILE" >/dev/null
    echo "created model ${MODEL}"
  fi
fi

echo "registering ${MODEL}@${VERSION}"
call POST /versions/ register "$VERSION_FILE" >/dev/null
# The registration's reply can be an idempotent replay of the first run's (draft): ask for the real status.
current=$(call GET "/versions/${VERSION}/" read | status)
echo "  status: ${current}"

if [ "$current" = draft ]; then
  call POST "/versions/${VERSION}/transitions/" validating '{"to": "validating", "reason": "CI evaluation"}' >/dev/null
  current=validating
fi

if [ "$current" = validating ]; then
  outcome=$(call POST "/versions/${VERSION}/reports/" report "$REPORT_FILE" | grep -o '"outcome":"[a-z]*"' | cut -d'"' -f4)
  echo "  validation: ${outcome}"
  if [ "$outcome" != passed ]; then
    call POST "/versions/${VERSION}/transitions/" rejected '{"to": "rejected", "reason": "validation failed in CI"}' >/dev/null
    echo "rejected: see the evaluation on the version page" >&2
    exit 1
  fi
fi

ORDER=(validating validated staged canary production)
rank() { local i; for i in "${!ORDER[@]}"; do [ "${ORDER[$i]}" = "$1" ] && { echo "$i"; return; }; done; echo -1; }
target=$(rank "$PROMOTE_TO")
[ "$target" -ge 1 ] || { echo "PROMOTE_TO must be validated, staged, canary or production" >&2; exit 2; }
[ "$(rank "$current")" -ge 0 ] || { echo "${MODEL}@${VERSION} is ${current}; nothing to promote" >&2; exit 1; }

while [ "$(rank "$current")" -lt "$target" ]; do
  next=${ORDER[$(( $(rank "$current") + 1 ))]}
  if [ "$next" = production ]; then
    : "${OVERRIDE_REASON:?production needs OVERRIDE_REASON until canary analysis is automated}"
    body="{\"to\": \"production\", \"override\": true, \"reason\": \"${OVERRIDE_REASON//\"/\'}\"}"
  else
    body="{\"to\": \"${next}\", \"reason\": \"CI pipeline\"}"
  fi
  current=$(call POST "/versions/${VERSION}/transitions/" "$next" "$body" | status)
  echo "  -> ${current}"
done
echo "${MODEL}@${VERSION} is ${current}"
