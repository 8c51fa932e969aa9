#!/bin/sh
# A multi-host MPI test bed on one machine: hosts are network namespaces
# joined by veth links to a bridge, each with its own hostname, and MPICH's
# hydra launches ranks across them.
#
#   scripts/testbed.sh [--hosts N] [--ppn K|K1,K2,..] [--delay 1ms] [--rate 1gbit] [--mpiexec PATH] -- PROGRAM [ARGS...]
#
# runs `mpiexec -launcher ssh -launcher-exec scripts/testbed-launch.sh
# -hosts h1:K,...,hN:K -n N*K PROGRAM ARGS` from inside host h1 (--ppn 2,1:
# 2 ranks on h1, 1 on h2, the last count repeating) and removes
# everything it made on exit (namespaces, links, /etc/netns entries), also
# on failure or Ctrl-C. Exit status: the program's, or 77 when network
# namespaces cannot be made here (not root, no `ip netns`, no unshare):
# tests treat 77 as "skip".
#
# What it builds (names carry this script's PID, so runs cannot collide):
#   namespace mctb<PID>-sw    a bridge "br0" (the switch)
#   namespace mctb<PID>-hI    host hI: lo, and "tb0" = 10.77.0.I/24, a veth
#                             whose other end is a port of br0; with
#                             --delay/--rate, a netem qdisc on tb0 shapes
#                             every packet the host sends (where the kernel
#                             has no netem: tbf for --rate, and no delay)
#   /etc/netns/mctb<PID>-hI/hosts   h1..hN -> 10.77.0.1..N (`ip netns exec`
#                             bind-mounts it over /etc/hosts, so hydra and
#                             MPI resolve the host names to the veth addresses)
# No address exists outside these namespaces and no traffic leaves them.
#
# MPI traffic: between hosts over tb0 (MPICH's ch4 netmod; MPICOLL_TB_NETMOD
# picks ofi (default, libfabric's tcp provider bound to tb0) or ucx),
# within a host through shared memory, as on a real cluster. The interfaces
# are named tb* so that mpicoll.bench.shm can read their byte counters.
set -eu

HOSTS=2 PPN=2 DELAY= RATE= MPIEXEC=
HERE=$(cd "$(dirname "$0")" && pwd)
while [ $# -gt 0 ]; do
    case $1 in
        --hosts) HOSTS=$2; shift 2 ;;
        --ppn) PPN=$2; shift 2 ;;
        --delay) DELAY=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        --mpiexec) MPIEXEC=$2; shift 2 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || { sed -n '6,7p' "$0" >&2; exit 2; }
[ -n "$MPIEXEC" ] || MPIEXEC=$(cd "$HERE/.." && pwd)/.venv/bin/mpiexec

P=mctb$$
SW=$P-sw

skip() { echo "testbed.sh: cannot build network namespaces here: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "not root"
command -v ip >/dev/null && command -v unshare >/dev/null || skip "ip or unshare missing"

cleanup() {
    for i in $(seq 1 "$HOSTS"); do
        ip netns del "$P-h$i" 2>/dev/null || true
        rm -rf "/etc/netns/$P-h$i"
    done
    ip netns del "$SW" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$SW" 2>/dev/null || skip "ip netns add failed"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
hostsfile="127.0.0.1 localhost"
for i in $(seq 1 "$HOSTS"); do hostsfile="$hostsfile
10.77.0.$i h$i"; done
hostlist=
nranks=0
for i in $(seq 1 "$HOSTS"); do
    ns=$P-h$i
    ip netns add "$ns"
    mkdir -p "/etc/netns/$ns"
    printf '%s\n' "$hostsfile" > "/etc/netns/$ns/hosts"
    ip link add "$P-a$i" type veth peer name "$P-b$i"
    ip link set "$P-a$i" netns "$ns"
    ip link set "$P-b$i" netns "$SW"
    ip -n "$ns" link set "$P-a$i" name tb0
    ip -n "$ns" addr add "10.77.0.$i/24" dev tb0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set tb0 up
    ip -n "$SW" link set "$P-b$i" master br0 up
    if [ -n "$DELAY$RATE" ]; then
        # limit: netem's queue (packets); the default 1000 drops at high rates x delays
        if ! ip netns exec "$ns" tc qdisc add dev tb0 root netem limit 100000 \
                ${DELAY:+delay $DELAY} ${RATE:+rate $RATE} 2>/dev/null; then
            # Kernels without sch_netem (e.g. minimal VM kernels): a token
            # bucket still shapes the rate; a delay cannot be emulated.
            [ -z "$DELAY" ] || echo "testbed.sh: no netem qdisc in this kernel: --delay $DELAY ignored" >&2
            [ -z "$RATE" ] || ip netns exec "$ns" tc qdisc add dev tb0 root tbf rate "$RATE" burst 256kb latency 100ms
        fi
    fi
    k=$(echo "$PPN" | cut -d, -f"$i")
    [ -n "$k" ] || k=$(echo "$PPN" | awk -F, '{print $NF}')
    hostlist="$hostlist${hostlist:+,}h$i:$k"
    nranks=$((nranks + k))
done

export MPICOLL_TB_PREFIX=$P
case ${MPICOLL_TB_NETMOD:-ofi} in
    ofi) export MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=tb0 ;;
    ucx) export MPIR_CVAR_CH4_NETMOD=ucx UCX_NET_DEVICES=tb0 UCX_TLS=tcp,self,sm ;;
esac
status=0
ip netns exec "$P-h1" unshare --uts sh -c 'hostname h1 && exec "$@"' sh \
    "$MPIEXEC" -launcher ssh -launcher-exec "$HERE/testbed-launch.sh" -hosts "$hostlist" \
    -n "$nranks" "$@" || status=$?
exit $status
