# shellcheck shell=bash
# Guest kernels for the scripts that boot guests (harness, demo, run-qemu).
# Requires scripts/lib/common.sh.
#
#   vnic_kernel SERIES [VARIANT]     echo the cached kernel directory of a series
#                                    (6.12, 7.3), building it first if needed.
#                                    Layout: DIR/bzImage, DIR/build (KDIR),
#                                    DIR/version.txt, DIR/config.
#   vnic_kernel_paths SERIES [VARIANT]
#                                    echo two lines: BZIMAGE and KDIR.
#   vnic_kernel_user BZIMAGE KDIR    check a user's own kernel (--kernel/--kdir):
#                                    the files exist, the tree is built and prepared
#                                    for modules, bzImage and tree are the same
#                                    release, and the options vnic needs are on.
#                                    Dies on hard errors, warns on soft ones.
#   vnic_bzimage_release BZIMAGE     echo the kernel release stored in a bzImage.

vnic_kernel() {
    local series=${1:?vnic_kernel SERIES [VARIANT]} variant=${2:-default}
    "$(vnic_repo_root)/images/build-kernel" --series "$series" --variant "$variant"
}

vnic_kernel_paths() {
    local d
    d=$(vnic_kernel "$@") || return 1
    printf '%s\n%s\n' "$d/bzImage" "$d/build"
}

vnic_bzimage_release() {
    # x86 boot protocol: "HdrS" at 0x202, kernel_version (u16) at 0x20e points
    # to a NUL-terminated string at that offset + 0x200.
    local f=$1 magic off
    magic=$(dd if="$f" bs=1 skip=$((0x202)) count=4 2>/dev/null)
    [ "$magic" = HdrS ] || return 1
    off=$(od -An -tu2 -j $((0x20e)) -N2 "$f" | tr -d ' ')
    dd if="$f" bs=1 skip=$((off + 0x200)) count=200 2>/dev/null | tr '\0' '\n' | head -1 | awk '{print $1}'
}

vnic_kernel_user() {
    local bz=${1:?vnic_kernel_user BZIMAGE KDIR} kdir=${2:?vnic_kernel_user BZIMAGE KDIR}
    local rel_bz rel_tree opt missing=()
    [ -f "$bz" ] || vnic_die "--kernel $bz: no such file"
    [ -d "$kdir" ] || vnic_die "--kdir $kdir: no such directory"
    rel_bz=$(vnic_bzimage_release "$bz") || vnic_die "--kernel $bz is not an x86 bzImage"
    [ -f "$kdir/.config" ] || vnic_die "--kdir $kdir: no .config (not a configured kernel tree)"
    [ -f "$kdir/include/config/kernel.release" ] ||
        vnic_die "--kdir $kdir: not prepared; run 'make modules_prepare' (or a full build) in it"
    rel_tree=$(cat "$kdir/include/config/kernel.release")
    [ -f "$kdir/Module.symvers" ] ||
        vnic_warn "--kdir $kdir: no Module.symvers (build the kernel fully, or modules will warn about undefined symbols)"
    [ "$rel_bz" = "$rel_tree" ] ||
        vnic_die "--kernel is release $rel_bz but --kdir is $rel_tree: modules built there would not load"
    for opt in SMP ACPI PCI_MSI VIRTIO_PCI VIRTIO_NET VIRTIO_CONSOLE RPS RFS_ACCEL XPS MODULES \
        MODULE_UNLOAD DEBUG_FS DEVTMPFS BLK_DEV_INITRD SERIAL_8250_CONSOLE UNIX INET PACKET; do
        grep -q "^CONFIG_$opt=y" "$kdir/.config" || missing+=("$opt")
    done
    [ ${#missing[@]} -eq 0 ] ||
        vnic_warn "your kernel lacks (as built-in): $(printf 'CONFIG_%s ' "${missing[@]}")- see images/kernel.config for what vnic guests need"
    return 0
}
