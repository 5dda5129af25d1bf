#!/usr/bin/env bash
# Ship a model version from CI: register it and post its evaluation (docs/ci/registry-ci.sh, up to
# staged), start a rollout onto a deployment, wait until it ends, print every analysis verdict, and fail
# the pipeline unless the rollout succeeded. Needs bash, curl and python3 (for reading JSON).
#
#   CONTROLPLANE_URL    e.g. https://cp.example.com
#   CONTROLPLANE_TOKEN  a robot token with registry:read, registry:write, registry:promote, deployments:read
#                       and deployments:write (registry:promote lets the rollout take the version from
#                       staged to canary and, when it succeeds, to production)
#   MODEL, VERSION_FILE, REPORT_FILE, MODEL_FILE   as for registry-ci.sh
#   DEPLOYMENT          owner/name of the deployment to roll out onto, e.g. acme-eu/support-bot
#   ROLLOUT_FILE        optional: a JSON object with the rollout's strategy, steps, analysis, waves,
#                       on_failure, alias, webhook... (docs/rollouts.md); without it, a canary with the
#                       default steps and analysis
#   ROLLOUT_TIMEOUT     seconds to wait for the end (default 3600); POLL_SECONDS between reads (default 10)
#   ABORT_ON_TIMEOUT    1: abort the rollout when the wait times out (default: it goes on by itself)
#   ROLLOUT_KEY         the start's Idempotency-Key (default ci-rollout-DEPLOYMENT-VERSION: a re-run of the
#                       pipeline follows the same rollout; put your CI run id in it to start a new one)
#   SKIP_REGISTER       1: the version is registered and staged already; only roll it out
#
# Exit status: 0 the rollout succeeded; 1 it was aborted or failed (the reason and the verdicts are
# printed), or the control plane refused a step (the error envelope is printed); 2 bad input; 3 the wait
# timed out.
set -euo pipefail

: "${CONTROLPLANE_URL:?}" "${CONTROLPLANE_TOKEN:?}" "${MODEL:?}" "${VERSION_FILE:?}" "${DEPLOYMENT:?}"
ROLLOUT_TIMEOUT="${ROLLOUT_TIMEOUT:-3600}"
POLL_SECONDS="${POLL_SECONDS:-10}"
ROLLOUTS="${CONTROLPLANE_URL%/}/api/v1/rollouts/"
export PYTHONIOENCODING=utf-8

# Reading and writing JSON, one small program: json.sh <command> [args] < JSON
read -r -d '' JSON_TOOL <<'PY' || true
import json, sys

def num(v):
    if v is None:
        return "—"
    return f"{v:.4g}" if isinstance(v, float) else str(v)

def field(doc, name):
    print(doc.get(name, "") if isinstance(doc, dict) else "")

def start_body(deployment, version, extra_file):
    body = json.load(open(extra_file)) if extra_file else {}
    if not isinstance(body, dict):
        sys.exit("ROLLOUT_FILE must hold a JSON object")
    body.update(deployment=deployment, version=version)
    print(json.dumps(body))

def progress(doc):
    weights = ", ".join(
        f"{w['region']} {w['traffic_percent']} %"
        + (f" mirror {w['mirror_percent']} %" if w["mirror_percent"] else "")
        + (f" ({w['candidate_status']})" if w["candidate_status"] != "ready" else "")
        for w in doc.get("weights", [])
    )
    steps = len(doc["steps"])
    step = f"step {doc['step'] + 1}/{steps}" if doc["step"] < steps else "its steps done"
    where = f"wave {doc['wave'] + 1}/{len(doc['waves'])} {step}"
    print(f"{doc['state']}: {where}; candidate {weights or 'not started'}")

def report(doc):
    print(f"rollout {doc['id']} of {doc['deployment']} ({doc['strategy']} of {doc['candidate']} over {doc['baseline']}): {doc['state']}")
    if doc.get("reason"):
        print(f"  reason: {doc['reason']}")
    runs = doc.get("analysis_runs", [])
    print(f"analysis runs: {len(runs) or 'none'}")
    for run in runs:
        line = f"  wave {run['wave'] + 1} step {run['step'] + 1} in {run['region']}: {run['verdict']}"
        print(line + (f" ({run['message']})" if run.get("message") else ""))
        for m in run.get("measurements") or []:
            test = f"; {m['test']} statistic {num(m.get('statistic'))} p {num(m.get('p_value'))}" if m.get("test") else ""
            why = f" ({m['reason']})" if m.get("reason") else ""
            print(
                f"    {m.get('metric')} {m.get('stat', '')}: candidate {num(m.get('candidate'))} (n={m.get('candidate_samples')})"
                f" vs baseline {num(m.get('baseline'))} (n={m.get('baseline_samples')}){test};"
                f" threshold {m.get('threshold') or '—'}: {m.get('verdict')}{why}"
            )
    print("timeline:")
    for e in doc.get("events", [])[-20:]:
        print(f"  {e['at']} {e['kind']}: {e['message']}")

command, args = sys.argv[1], sys.argv[2:]
if command == "start-body":
    start_body(*args)
else:
    doc = json.load(sys.stdin)
    {"field": lambda: field(doc, *args), "progress": lambda: progress(doc), "report": lambda: report(doc)}[command]()
PY
json() { python3 -c "$JSON_TOOL" "$@"; }

call() {  # call METHOD URL STEP [JSON]: prints the body; on 4xx/5xx prints the error envelope and exits 1
  local method=$1 url=$2 step=$3 body=${4:-"{}"}
  local args=(-sS --fail-with-body -X "$method" -H "Authorization: Bearer ${CONTROLPLANE_TOKEN}")
  if [ "$method" = POST ]; then
    args+=(-H "Content-Type: application/json" -H "Idempotency-Key: ${ROLLOUT_KEY}-${step}" --data "$body")
  fi
  local out
  if ! out=$(curl "${args[@]}" "$url"); then
    printf '%s\nstep %s failed\n' "$out" "$step" >&2
    exit 1
  fi
  printf '%s' "$out"
}

VERSION=$(json field version < "$VERSION_FILE")
[ -n "$VERSION" ] || { echo "VERSION_FILE has no \"version\"" >&2; exit 2; }
ROLLOUT_KEY="${ROLLOUT_KEY:-ci-rollout-${DEPLOYMENT}-${VERSION}}"
if [ -n "${ROLLOUT_FILE:-}" ] && ! [ -f "$ROLLOUT_FILE" ]; then echo "no ROLLOUT_FILE ${ROLLOUT_FILE}" >&2; exit 2; fi
body=$(json start-body "$DEPLOYMENT" "$VERSION" "${ROLLOUT_FILE:-}") || exit 2

if [ "${SKIP_REGISTER:-}" != 1 ]; then
  : "${REPORT_FILE:?}"
  PROMOTE_TO=staged bash "$(dirname "$0")/registry-ci.sh"
fi

echo "starting a rollout of ${MODEL}@${VERSION} onto ${DEPLOYMENT}"
started=$(call POST "$ROLLOUTS" start "$body")
id=$(printf '%s' "$started" | json field id)
echo "  rollout ${id}: ${CONTROLPLANE_URL%/}/rollouts/${id}/"

deadline=$(( $(date +%s) + ROLLOUT_TIMEOUT ))
last=""
while :; do
  doc=$(call GET "${ROLLOUTS}${id}/" read)
  now=$(printf '%s' "$doc" | json progress)
  [ "$now" = "$last" ] || echo "  ${now}"
  last=$now
  state=$(printf '%s' "$doc" | json field state)
  case "$state" in succeeded | aborted | failed) break ;; esac
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "rollout ${id} is still ${state} after ${ROLLOUT_TIMEOUT} s" >&2
    if [ "${ABORT_ON_TIMEOUT:-}" = 1 ]; then
      call POST "${ROLLOUTS}${id}/abort/" abort "{\"reason\": \"CI gave up waiting after ${ROLLOUT_TIMEOUT} s\"}" >/dev/null
      doc=$(call GET "${ROLLOUTS}${id}/" read)
    fi
    printf '%s' "$doc" | json report
    exit 3
  fi
  sleep "$POLL_SECONDS"
done

printf '%s' "$doc" | json report
if [ "$state" != succeeded ]; then
  echo "rollout ${id} ${state}: $(printf '%s' "$doc" | json field reason)" >&2
  exit 1
fi
echo "${MODEL}@${VERSION} rolled out onto ${DEPLOYMENT}"
