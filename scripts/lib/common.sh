# shellcheck shell=bash
# Common helpers for vnic's shell scripts. Source it; it defines functions only.

# Where every built artefact lives (kernels, initramfs images, the private apt state).
vnic_cache() { printf '%s\n' "${VNIC_CACHE:-${HOME:-/root}/.cache/vnic}"; }

# Root of the repository (this file is scripts/lib/common.sh).
vnic_repo_root() { (cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd); }

# Progress and errors go to stderr so that stdout stays machine-readable (paths).
vnic_log() { printf '[vnic %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
vnic_warn() { printf '[vnic %s] warning: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
vnic_die() {
    printf '[vnic] error: %s\n' "$*" >&2
    exit 1
}

# Hash of the given files' contents (and names' basenames), short form.
vnic_hash_files() {
    local f
    for f in "$@"; do
        printf '%s\n' "$(basename "$f")"
        cat "$f"
    done | sha256sum | cut -c1-12
}

# Run a command as root (directly, or through sudo when not root).
vnic_as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        vnic_die "need root for: $*"
    fi
}
