#!/usr/bin/env bash
# Makes a debootstrapped bookworm tree a test node: a root on /dev/vda, no
# login prompts on the console, and vmtest.service, which mounts the
# payload disk (/dev/vdb) at /payload, runs /payload/guest/run.sh with its
# output on the serial console and powers the guest off at once when it
# ends (the unit's own actions are the fallback).
#   test/vm/customize.sh ROOT
set -euo pipefail
R=${1:?usage: customize.sh ROOT}
echo "/dev/vda / ext4 rw,relatime 0 1" >"$R/etc/fstab"
echo crishim-vm >"$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 crishim-vm\n' >"$R/etc/hosts"
: >"$R/etc/machine-id"
for u in serial-getty@ttyS0.service getty@tty1.service systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer; do
	ln -sfn /dev/null "$R/etc/systemd/system/$u"
done
install -d -m 0755 "$R/payload" "$R/usr/local/sbin"
cat >"$R/usr/local/sbin/vmtest" <<'SH'
#!/bin/sh
mount /dev/vdb /payload || exit 1
/payload/guest/run.sh
rc=$?
echo "vmtest: exit $rc" >/payload/out/rc
sync
umount /payload || umount -l /payload
sync
# Off at once: an orderly poweroff (SuccessAction) did not come after a
# successful run of this unit twice; the payload is written and the root
# is a snapshot, so nothing is lost.
systemctl poweroff -ff
exit $rc
SH
chmod 0755 "$R/usr/local/sbin/vmtest"
cat >"$R/etc/systemd/system/vmtest.service" <<'UNIT'
[Unit]
Description=cri-shim guest tests (/payload/guest/run.sh)
After=basic.target local-fs.target
[Service]
Type=oneshot
ExecStart=/usr/local/sbin/vmtest
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
TimeoutStartSec=infinity
SuccessAction=poweroff-force
FailureAction=poweroff-force
[Install]
WantedBy=multi-user.target
UNIT
ln -sfn /etc/systemd/system/vmtest.service "$R/etc/systemd/system/multi-user.target.wants/vmtest.service"
