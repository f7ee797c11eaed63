#!/bin/busybox sh
# /init of the vnic guest initramfs (busybox sh). Installed by images/build-initramfs.
#
# Mounts proc, sysfs, devtmpfs, devpts, debugfs, tmpfs; brings up lo; then, by
# the kernel command line option vnic.agent=:
#   exec (default)  exec /sbin/vnic-agent as PID 1 if it exists
#   run             run /sbin/vnic-agent as a child; power off when it exits
#   shell           run /sbin/vnic-agent in the background and the shell below
#   off             skip the agent
# and falls back to a shell on the console (power off when the shell exits).
# Modules listed in vnic.modules=a,b are loaded (modprobe) before the agent.
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /root
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
/bin/busybox mkdir -p /dev/pts /dev/shm
/bin/busybox mount -t devpts devpts /dev/pts
/bin/busybox mount -t tmpfs tmpfs /dev/shm
/bin/busybox mount -t tmpfs tmpfs /tmp
/bin/busybox mount -t tmpfs tmpfs /run
/bin/busybox mount -t debugfs debugfs /sys/kernel/debug

export PATH=/sbin:/usr/sbin:/bin:/usr/bin HOME=/root TERM=vt100
hostname vnic-guest
ip link set lo up

mode=exec
modules=""
for opt in $(cat /proc/cmdline); do
    case "$opt" in
    vnic.agent=*) mode=${opt#vnic.agent=} ;;
    vnic.modules=*) modules=${opt#vnic.modules=} ;;
    esac
done

# Modules first (a distribution kernel has virtio_pci, virtio_net and
# virtio_console as modules: the agent's port appears only once they load).
for m in $(echo "$modules" | tr ',' ' '); do
    modprobe "$m" || echo "vnic-init: modprobe $m failed" >/dev/console
done

# Named virtio-serial ports (no udev here): /dev/virtio-ports/<name> -> /dev/vportXpY.
# Ports are announced asynchronously by the device: wait up to 1 s for them.
if ls -d /sys/bus/virtio/drivers/virtio_console/virtio* >/dev/null 2>&1; then
    i=0
    while [ $i -lt 10 ] && ! ls /sys/class/virtio-ports/*/name >/dev/null 2>&1; do
        usleep 100000
        i=$((i + 1))
    done
    mkdir -p /dev/virtio-ports
    for p in /sys/class/virtio-ports/*; do
        [ -r "$p/name" ] || continue
        n=$(cat "$p/name")
        [ -n "$n" ] && ln -sf "../${p##*/}" "/dev/virtio-ports/$n"
    done
fi

up=$(cut -d' ' -f1 /proc/uptime)
echo "vnic-init: userspace up at ${up}s, $(grep -c ^processor /proc/cpuinfo) cpus, agent mode $mode" >/dev/console

if [ -x /sbin/vnic-agent ]; then
    case "$mode" in
    exec) exec /sbin/vnic-agent ;;
    shell)
        # The agent serves the host in the background (its messages in
        # /tmp/vnic-agent.log); the shell below has the console.
        /sbin/vnic-agent </dev/null >/tmp/vnic-agent.log 2>&1 &
        ;;
    run)
        /sbin/vnic-agent
        echo "vnic-init: vnic-agent exited with status $?; powering off" >/dev/console
        poweroff -f
        ;;
    esac
fi

echo "vnic-init: starting a shell on the console; exit it to power off" >/dev/console
setsid cttyhack sh -l
poweroff -f
