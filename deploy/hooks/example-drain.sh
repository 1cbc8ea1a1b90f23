#!/bin/sh
# Example starpulse exec hook (ExecScheduler). starpulse runs it WITHOUT a shell as:
#   example-drain.sh <action> <node> <reason>
# with STARPULSE_ACTION, STARPULSE_NODE, STARPULSE_REASON set (node names are already
# validated and the reason is one sanitised line, but treat both as data: always quote).
# Exit 0: done. Exit 75 (EX_TEMPFAIL): temporary, starpulse retries later. Other: permanent.
#
# Configure, e.g.:  hooks = {"drain": ["/etc/starpulse/hooks/example-drain.sh"],
#                            "cordon": [...same...], "resume": [...same...]}
set -eu

action=${1:?action}
node=${2:?node}
reason=${3:-unspecified}
log=${STARPULSE_HOOK_LOG:-/var/log/starpulse/hooks.log}
lock=${STARPULSE_HOOK_LOCK:-/run/starpulse-hook.lock}

case "$action" in
  cordon|drain|resume) ;;
  *) echo "example-drain.sh: unsupported action $action" >&2; exit 64 ;;
esac

# Another change window holds the lock: ask starpulse to retry rather than fail.
if [ -e "$lock" ]; then
  echo "change freeze in effect ($lock)" >&2
  exit 75
fi

mkdir -p "$(dirname "$log")"
printf '%s %s %s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$action" "$node" "$reason" >> "$log"

# Put the site's real call here, e.g. a ticket plus the scheduler command:
#   scontrol update NodeName="$node" State=DRAIN Reason="starpulse: $reason"
echo "$action $node recorded"
