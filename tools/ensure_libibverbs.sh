#!/usr/bin/env bash
# The Mooncake Store client and mooncake_master (the `store` extra) link libibverbs.so.1,
# Debian's libibverbs1. Install it where it is missing (apt-get, as root: the way `make`
# runs in CI), or stop with the command to run.
set -euo pipefail

have_lib() {
    /sbin/ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' \
        || ls /usr/lib/*/libibverbs.so.1 /usr/lib/libibverbs.so.1 >/dev/null 2>&1
}

if have_lib; then
    exit 0
fi
fail() {
    echo "error: libibverbs.so.1 is missing (the Mooncake Store tier needs it) and $1;" \
        "install it as root: apt-get update && apt-get install -y libibverbs1" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || fail "this is not root"
command -v apt-get >/dev/null || fail "there is no apt-get here"
echo "installing libibverbs1 (apt-get) for the Mooncake Store tier"
apt-get update -qq || fail "apt-get update failed"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null \
    || fail "apt-get install libibverbs1 failed"
have_lib || fail "it is still not found after apt-get install"
