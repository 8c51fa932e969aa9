#!/bin/sh
# hydra's "ssh" launcher for the namespace test bed (see testbed.sh).
#
# mpiexec -launcher ssh -launcher-exec THIS calls it as ssh would be called:
#     THIS -x HOST "/path/hydra_pmi_proxy" --control-port h1:PORT ... --proxy-id N
# i.e. options, the host, then the proxy command as words that a remote
# shell would join and parse (hydra quotes the executable's path). So: skip
# the options, and run the joined command with sh inside HOST's network
# namespace and a fresh UTS namespace whose hostname is HOST.
while [ "${1#-}" != "$1" ]; do shift; done
host=$1
shift
[ -n "$MPICOLL_TB_PREFIX" ] || { echo "testbed-launch.sh: MPICOLL_TB_PREFIX is not set (run testbed.sh)" >&2; exit 2; }
exec ip netns exec "$MPICOLL_TB_PREFIX-$host" unshare --uts sh -c "hostname $host && exec $*"
