#!/bin/sh
# Runs inside the guest as /sbin/vnic-agent for images/smoke-test: answers the
# host over the vnic.agent virtio-serial port, reports facts on the console as
# "SMOKE key=value" lines, then powers off.
port=/dev/virtio-ports/vnic.agent
echo "SMOKE uptime_at_agent=$(cut -d' ' -f1 /proc/uptime)"
echo "SMOKE cpus_online=$(cat /sys/devices/system/cpu/online)"
echo "SMOKE nproc=$(nproc)"
echo "SMOKE vports=$(ls /dev/vport* 2>/dev/null | tr '\n' ',')"
echo "SMOKE port_names=$(cat /sys/class/virtio-ports/*/name 2>/dev/null | tr '\n' ',')"
echo "SMOKE kernel=$(uname -r)"
echo "SMOKE netdevs=$(ls /sys/class/net | tr '\n' ',')"
echo "SMOKE debugfs=$(grep -c ' /sys/kernel/debug debugfs ' /proc/mounts)"
echo "SMOKE rps_sock_flow_entries=$(cat /proc/sys/net/core/rps_sock_flow_entries 2>/dev/null || echo missing)"
echo "SMOKE rfs_accel=$(zcat /proc/config.gz 2>/dev/null | grep -c '^CONFIG_RFS_ACCEL=y')"
for d in /sys/class/net/eth*; do
    [ -e "$d" ] || continue
    echo "SMOKE ${d##*/}_rx_queues=$(ls -d "$d"/queues/rx-* | wc -l)"
done
# With vnic attached: address eth0 and ping the peer (vnic's gen answers ARP/ICMP).
ip_addr="" ping_to=""
for opt in $(cat /proc/cmdline); do
    case "$opt" in
    vnic.smoke_ip=*) ip_addr=${opt#*=} ;;
    vnic.smoke_ping=*) ping_to=${opt#*=} ;;
    esac
done
if [ -n "$ip_addr" ] && [ -e /sys/class/net/eth0 ]; then
    ip addr add "$ip_addr" dev eth0
    ip link set eth0 up
    echo "SMOKE eth0_combined=$(ls -d /sys/class/net/eth0/queues/tx-* | wc -l)"
    if [ -n "$ping_to" ]; then
        ok=$(ping -c 3 -W 5 "$ping_to" 2>&1 | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
        echo "SMOKE ping_received=${ok:-0}"
    fi
fi
# The host connects to the agent socket and sends one line; reads on an
# unconnected port return EOF at once, so retry for up to 30 s.
line=""
i=0
while [ $i -lt 300 ] && [ -e "$port" ]; do
    if read -r line <"$port" && [ -n "$line" ]; then break; fi
    usleep 100000
    i=$((i + 1))
done
echo "SMOKE port_received=$line"
[ -n "$line" ] && echo "pong $line" >"$port"
echo "SMOKE done uptime=$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
