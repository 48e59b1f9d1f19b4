#!/usr/bin/env bash
# Two ranks on two "hosts": two network namespaces of this machine joined by a veth pair,
# started by mpirun from a hostfile of their addresses with scripts/netns_launch.sh in ssh's
# place, talking TCP over the veth (shared memory is off: they are different hosts to MPI).
# The run must end on the final loss of one process. Needs root (ip netns) and the MPI build.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none

cleanup() {
  ip netns del kiln-host-a 2>/dev/null || true
  ip netns del kiln-host-b 2>/dev/null || true
  ip link del kiln-veth-a 2>/dev/null || true
}
trap cleanup EXIT
cleanup
ip netns add kiln-host-a
ip netns add kiln-host-b
ip link add kiln-veth-a type veth peer name kiln-veth-b
ip link set kiln-veth-a netns kiln-host-a
ip link set kiln-veth-b netns kiln-host-b
ip -n kiln-host-a addr add 10.77.0.1/24 dev kiln-veth-a
ip -n kiln-host-b addr add 10.77.0.2/24 dev kiln-veth-b
for ns in kiln-host-a kiln-host-b; do
  ip -n "$ns" link set lo up
done
ip -n kiln-host-a link set kiln-veth-a up
ip -n kiln-host-b link set kiln-veth-b up

# The debug build scripts/mpi_tests.sh made (see there why not release).
cargo build --locked --features mpi --example data_parallel
bin=$PWD/target/debug/examples/data_parallel
steps=40
alone=$("$bin" --steps "$steps" | awk '/^final loss/ { print $3 }')

work=$(mktemp -d)
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$work/hosts"
export KILN_NETNS_HOSTS="10.77.0.1=kiln-host-a 10.77.0.2=kiln-host-b"
# mpirun runs on "host a"; it starts host b's daemon through the launcher.
out=$(timeout 300 ip netns exec kiln-host-a mpirun -n 2 --hostfile "$work/hosts" \
  --mca plm_rsh_agent "$PWD/scripts/netns_launch.sh" \
  --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
  -x KILN_COMM_TIMEOUT=60 -x OMPI_MCA_btl_vader_single_copy_mechanism -x KILN_NETNS_HOSTS \
  "$bin" --steps "$steps")
echo "$out"
got=$(echo "$out" | awk '/^final loss/ { print $3 }')
ranks=$(echo "$out" | grep -c '^rank [01]:' || true)
if [[ "$ranks" -ne 2 || "$got" != "$alone" ]]; then
  echo "FAIL: two hosts: $ranks rank lines, final loss '$got', one process $alone"; exit 1
fi
echo "ok: two hosts (network namespaces over a veth pair, TCP): final loss $got equals one process $alone"
