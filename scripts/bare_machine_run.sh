#!/usr/bin/env bash
# `make run` as a new user meets it: a fresh Debian 12 (debootstrap minbase) chroot with only `make` added,
# a clone of this repository's HEAD in it, then `make run` timed end to end. Needs root, debootstrap and the
# Debian mirror; the README's bare-machine figure comes from it.
#   scripts/bare_machine_run.sh [DIR]      (default /tmp/anvil-bare; removed first)
set -euo pipefail
dir=${1:-/tmp/anvil-bare}
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
[[ $(id -u) -eq 0 ]] || { echo "bare_machine_run: needs root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
rm -rf "$dir"
debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian >/dev/null
cleanup() { umount -R "$dir/dev" "$dir/sys" 2>/dev/null || true; umount "$dir/proc" 2>/dev/null || true; }
trap cleanup EXIT
mount -t proc proc "$dir/proc"
mount --rbind /sys "$dir/sys"
mount --rbind /dev "$dir/dev"
cp /etc/resolv.conf "$dir/etc/resolv.conf"
git clone -q "$repo" "$dir/root/anvil"
chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBIAN_FRONTEND=noninteractive \
    bash -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends make >/dev/null &&
             cd /root/anvil && s=$(date +%s) && make run && echo "bare_machine_run: make run took $(( $(date +%s) - s )) s"'
