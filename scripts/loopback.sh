#!/usr/bin/env bash
# Run a command inside a network namespace that has only loopback (127.0.0.1).
# Ray binds some of its servers on all interfaces and rewrites 127.0.0.1 to the machine's other
# address; in a loopback-only namespace nothing can listen on, or reach, any other address.
set -euo pipefail
if [ "${EMR_RAY_IN_LOOPBACK:-}" = 1 ]; then exec "$@"; fi
inner='ip link set lo up 2>/dev/null || true; export EMR_RAY_IN_LOOPBACK=1; exec "$@"'
if unshare -n true 2>/dev/null; then
  exec unshare -n bash -c "$inner" bash "$@"
elif unshare -rn true 2>/dev/null; then
  exec unshare -rn bash -c "$inner" bash "$@"
fi
echo "Cannot create a loopback-only network namespace (unshare -n / unshare -rn both failed)." >&2
echo "Run as root, or enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1)." >&2
exit 1
