#!/usr/bin/env bash
# The QEMU guest test of portverbs-vfio: real VFIO, a real IOMMU, real MSI/MSI-X.
#
#   tests/vfio-guest/run.sh
#
# 1. Builds tests/vfio-guest as a static binary.
# 2. Finds a Debian kernel: $VFIO_GUEST_KERNEL + $VFIO_GUEST_MODULES if set; else an installed
#    /boot/vmlinuz-<v> with /lib/modules/<v>; else the package linux-image-amd64 points to,
#    fetched with `apt-get download` and unpacked under the target directory (no install into
#    /boot, no initramfs or bootloader hooks), with modules.dep made by depmod.
# 3. Packs an initramfs: busybox-static, the vfio modules in modules.dep order, the test binary
#    and tests/vfio-guest/init.
# 4. Boots qemu-system-x86_64 under TCG (KVM on the CI machine is PVM and hangs stock kernels)
#    with -M q35, an intel-iommu with interrupt remapping, and QEMU's edu and nvme devices;
#    the guest binds both to vfio-pci and runs `vfio-guest run`.
# 5. Checks the console log on the host (`vfio-guest verify`): any FAIL, any missing check, a
#    missing summary or the hard timeout ($VFIO_GUEST_TIMEOUT, default 60 s) fails the run.
#
# Needs: qemu-system-x86, busybox-static, cpio, kmod (depmod), and the Rust target
# x86_64-unknown-linux-gnu. Output goes to $CARGO_TARGET_DIR/vfio-guest (default target/).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
target_dir=${CARGO_TARGET_DIR:-$repo/target}
work=$target_dir/vfio-guest
timeout_s=${VFIO_GUEST_TIMEOUT:-60}
serial=vfiotest01
mkdir -p "$work"

now_ms() { date +%s%3N; }
t_start=$(now_ms)
die() { echo "vfio-guest: $*" >&2; exit 1; }
# shellcheck source=../guest-lib.sh
source "$repo/tests/guest-lib.sh"

for tool in qemu-system-x86_64 cpio gzip; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install qemu-system-x86 cpio)"
done
busybox=${BUSYBOX:-/bin/busybox}
guest_check_busybox "$busybox"

# --- 1. the static test binary -------------------------------------------------------------
echo "==> building the guest binary (static)"
t0=$(now_ms)
RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --quiet \
    --target x86_64-unknown-linux-gnu -p portverbs-vfio-guest
bin=$target_dir/x86_64-unknown-linux-gnu/release/vfio-guest
[[ -x $bin ]] || die "no binary at $bin"
t_build=$(($(now_ms) - t0))

# --- 2. the kernel ------------------------------------------------------------------------
guest_find_kernel "$target_dir/guest-kernel" vfio-pci "${VFIO_GUEST_KERNEL:-}" "${VFIO_GUEST_MODULES:-}"
echo "==> kernel $kernel"

# --- 3. the initramfs ---------------------------------------------------------------------
echo "==> packing the initramfs"
t0=$(now_ms)
root=$work/initramfs
rm -rf "$root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,lib/modules}
cp "$busybox" "$root/bin/busybox"
cp "$bin" "$root/bin/vfio-guest"
cp tests/vfio-guest/init "$root/init"
chmod 755 "$root/init"

guest_pack_modules "$moddir" "$root" vfio vfio_iommu_type1 vfio-pci
initrd=$work/initramfs.cpio.gz
guest_pack_initramfs "$root" "$initrd"
t_initrd=$(($(now_ms) - t0))
echo "    modules: $(tr '\n' ' ' <"$root/modules.order")($(du -h "$initrd" | cut -f1))"

# --- 4. boot ------------------------------------------------------------------------------
log=$work/console.log
echo "==> booting QEMU (TCG, q35, intel-iommu intremap=on, edu, nvme); timeout ${timeout_s}s"
t0=$(now_ms)
set +e
timeout -k 5 "$timeout_s" qemu-system-x86_64 \
    -accel tcg -M q35 -cpu max -m 256 -smp 1 \
    -nographic -nodefaults -serial stdio -no-reboot \
    -device intel-iommu,intremap=on \
    -device edu \
    -device "nvme,serial=$serial" \
    -kernel "$kernel" -initrd "$initrd" \
    -append "console=ttyS0 intel_iommu=on panic=-1 loglevel=3 vfio_guest_serial=$serial" \
    </dev/null 2>"$work/qemu.stderr" | tee "$log"
qemu_rc=${PIPESTATUS[0]}
set -e
t_boot=$(($(now_ms) - t0))
# QEMU's own messages (its IOMMU model reports the blocked DMA) are kept apart from the
# console, so they cannot split a result line.
if [[ -s $work/qemu.stderr ]]; then
    echo "--- QEMU stderr:"
    cat "$work/qemu.stderr"
fi

# --- 5. verdict ---------------------------------------------------------------------------
echo
echo "==> results"
status=0
if ((qemu_rc == 124 || qemu_rc == 137)); then
    echo "vfio-guest: QEMU hit the ${timeout_s}s timeout and was killed" >&2
    status=1
elif ((qemu_rc != 0)); then
    echo "vfio-guest: QEMU exited with status $qemu_rc" >&2
    status=1
fi
"$bin" verify "$log" || status=1
t_total=$(($(now_ms) - t_start))
printf 'vfio-guest: build %d ms, initramfs %d ms, boot+test %d ms, total %d ms\n' \
    "$t_build" "$t_initrd" "$t_boot" "$t_total"
if ((status != 0)); then
    echo "vfio-guest: FAILED (console log: $log)" >&2
else
    echo "vfio-guest: PASSED"
fi
exit "$status"
