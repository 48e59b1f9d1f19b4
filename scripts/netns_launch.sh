#!/usr/bin/env bash
# mpirun's remote launcher for scripts/two_hosts.sh (`--mca plm_rsh_agent`), in ssh's place:
# OpenMPI calls it as `netns_launch.sh [options] HOST COMMAND...`, and it runs COMMAND in the
# network namespace that plays HOST. `KILN_NETNS_HOSTS` maps addresses to namespaces:
# "10.77.0.1=kiln-a 10.77.0.2=kiln-b".
set -euo pipefail
while [[ "${1:-}" == -* ]]; do shift; done
host="$1"; shift
for pair in ${KILN_NETNS_HOSTS:-}; do
  if [[ "${pair%%=*}" == "$host" ]]; then
    exec ip netns exec "${pair#*=}" /bin/sh -c "$*"
  fi
done
echo "netns_launch.sh: no namespace plays host $host (KILN_NETNS_HOSTS='${KILN_NETNS_HOSTS:-}')" >&2
exit 1
