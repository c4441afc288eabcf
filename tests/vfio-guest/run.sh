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

for tool in qemu-system-x86_64 cpio gzip; do
    command -v "$tool" >/dev/null || die "$tool is missing (apt-get install qemu-system-x86 cpio)"
done
busybox=${BUSYBOX:-/bin/busybox}
[[ -x $busybox ]] || die "$busybox is missing (apt-get install busybox-static)"
# ldd succeeds only on dynamically linked programs.
if command -v ldd >/dev/null && ldd "$busybox" >/dev/null 2>&1; then
    die "$busybox is dynamically linked; the initramfs needs busybox-static"
fi

# --- 1. the static test binary -------------------------------------------------------------
echo "==> building the guest binary (static)"
t0=$(now_ms)
RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --quiet \
    --target x86_64-unknown-linux-gnu -p portverbs-vfio-guest
bin=$target_dir/x86_64-unknown-linux-gnu/release/vfio-guest
[[ -x $bin ]] || die "no binary at $bin"
t_build=$(($(now_ms) - t0))

# --- 2. the kernel ------------------------------------------------------------------------
has_vfio() { [[ -f $1/modules.dep ]] && grep -q 'vfio-pci\.ko' "$1/modules.dep"; }

kernel=${VFIO_GUEST_KERNEL:-}
moddir=${VFIO_GUEST_MODULES:-}
if [[ -n $kernel || -n $moddir ]]; then
    [[ -f $kernel ]] || die "VFIO_GUEST_KERNEL=$kernel is not a file"
    has_vfio "$moddir" || die "VFIO_GUEST_MODULES=$moddir has no modules.dep listing vfio-pci"
else
    for k in $(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -rV); do
        v=${k#/boot/vmlinuz-}
        if has_vfio "/lib/modules/$v"; then kernel=$k moddir=/lib/modules/$v; break; fi
    done
fi
if [[ -z $kernel ]]; then
    kroot=$work/kernel/root
    for k in $(ls -1 "$kroot"/boot/vmlinuz-* 2>/dev/null | sort -rV); do
        v=${k##*/vmlinuz-}
        if has_vfio "$kroot/lib/modules/$v"; then kernel=$k moddir=$kroot/lib/modules/$v; break; fi
    done
fi
if [[ -z $kernel ]]; then
    for tool in apt-get apt-cache dpkg-deb depmod; do
        command -v "$tool" >/dev/null ||
            die "no kernel found and $tool is missing to fetch one (apt-get install kmod, or set VFIO_GUEST_KERNEL and VFIO_GUEST_MODULES)"
    done
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
    [[ -n $pkg ]] || die "apt-cache knows no linux-image-amd64; run apt-get update"
    echo "==> fetching $pkg (apt-get download + dpkg-deb -x, no install)"
    t0=$(now_ms)
    rm -rf "$work/kernel"
    mkdir -p "$work/kernel"
    (cd "$work/kernel" && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
    deb=$(ls -1 "$work/kernel"/"$pkg"_*.deb 2>/dev/null | head -n1)
    [[ -f $deb ]] || die "apt-get download $pkg produced no .deb"
    dpkg-deb -x "$deb" "$kroot"
    rm -f "$deb"
    k=$(ls -1 "$kroot"/boot/vmlinuz-* | head -n1)
    v=${k##*/vmlinuz-}
    depmod -b "$kroot" "$v"
    kernel=$k moddir=$kroot/lib/modules/$v
    has_vfio "$moddir" || die "$pkg has no vfio-pci module"
    echo "    kernel $v ready in $(($(now_ms) - t0)) ms"
fi
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

# Modules in load order: modules.dep lists every (transitive) dependency of a module so that
# loading the list from its end works; each module comes after what it needs.
declare -A seen=()
order=()
add_module() {
    local path=$1
    [[ -n ${seen[$path]:-} ]] && return
    seen[$path]=1
    order+=("$path")
}
for want in vfio vfio_iommu_type1 vfio-pci; do
    line=$(grep -E "(^|/)$want\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -n1) ||
        die "$want is not in $moddir/modules.dep"
    self=${line%%:*}
    read -r -a deps <<<"${line#*:}"
    for ((i = ${#deps[@]} - 1; i >= 0; i--)); do add_module "${deps[i]}"; done
    add_module "$self"
done
: >"$root/modules.order"
for m in "${order[@]}"; do
    cp "$moddir/$m" "$root/lib/modules/"
    echo "${m##*/}" >>"$root/modules.order"
done
initrd=$work/initramfs.cpio.gz
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$initrd"
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
