#!/usr/bin/env bash
# Runs the unit tests (`make unit`: vet and go test -race) as an unprivileged
# user on a copy of the working tree, to show they touch nothing of the
# machine: no /var/lib/cri-shim, no /run, no fixed port. A test that writes to
# a machine path fails here with "permission denied" instead of silently
# writing into the real state directory as root.
#
#   test/unit-nonroot.sh [USER] [go test args...]   (run as root; USER defaults to nobody)
set -euo pipefail
user=${1:-nobody}
shift || true
[ "$(id -u)" = 0 ] || { echo "unit-nonroot: run as root (it drops to $user)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
go=$(command -v go)
# A fixed, short place (unix socket paths under t.TempDir() must stay below
# 108 bytes): the build cache there is reused by the next run; the copy of
# the tree is made afresh.
base=${CRI_SHIM_NONROOT_DIR:-/tmp/cri-shim-nonroot}
tmp=$base
cache=$base/cache
rm -rf "$base/src" "$base/t"
mkdir -p "$base/src" "$base/home" "$base/t" "$cache"
# The working tree as it is (uncommitted changes included), without build output.
tar -C "$repo" --exclude=./_output --exclude=./.stack --exclude=./.git -cf - . | tar -C "$tmp/src" -xf -
# Modules from root's cache into vendor/, so the unprivileged run needs no access to it.
(cd "$tmp/src" && GOFLAGS=-mod=mod "$go" mod vendor)
chown -R "$user" "$tmp"
chmod -R a+rX "$tmp"
pkgs=(./cmd/... ./internal/... ./docs/)
run() {
	setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups \
		env -i PATH="$(dirname "$go"):/usr/bin:/bin" HOME="$tmp/home" GOCACHE="$cache" \
		GOPATH="$tmp/home/go" GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOTELEMETRY=off TMPDIR="$tmp/t" \
		bash -c 'cd "$0" && id && "$@"' "$tmp/src" "$@"
}
run "$go" vet "${pkgs[@]}"
run "$go" test -race -count=1 "$@" "${pkgs[@]}"

# A skipped end-to-end suite is not a pass: as this user `make stack` and the
# suite must fail, saying why; only the explicit opt-out skips with exit 0.
if run make -s stack >"$base/stack.log" 2>&1; then
	echo "unit-nonroot: FAIL: make stack succeeded as $user" >&2; exit 1
fi
grep -q "not root" "$base/stack.log" || { cat "$base/stack.log"; echo "unit-nonroot: FAIL: make stack did not say why" >&2; exit 1; }
echo "unit-nonroot: make stack as $user fails: $(grep -m1 'not root' "$base/stack.log")"
if run "$go" test -count=1 -v ./test/e2e/ >"$base/e2e.log" 2>&1; then
	echo "unit-nonroot: FAIL: the end-to-end suite passed as $user" >&2; exit 1
fi
grep -q "NOT RUN: not root" "$base/e2e.log" || { tail -20 "$base/e2e.log"; echo "unit-nonroot: FAIL: no banner saying why" >&2; exit 1; }
echo "unit-nonroot: the end-to-end suite as $user fails with the banner ($(grep -c -- '--- SKIP' "$base/e2e.log" || true) tests skipped)"
run env CRI_SHIM_E2E_ALLOW_SKIP=1 "$go" test -count=1 -v ./test/e2e/ >"$base/e2e-allowed.log" 2>&1 ||
	{ tail -20 "$base/e2e-allowed.log"; echo "unit-nonroot: FAIL: CRI_SHIM_E2E_ALLOW_SKIP=1 did not exit 0" >&2; exit 1; }
echo "unit-nonroot: with CRI_SHIM_E2E_ALLOW_SKIP=1 it exits 0 ($(grep -c -- '--- SKIP' "$base/e2e-allowed.log") tests skipped)"
echo "unit-nonroot: ok"
