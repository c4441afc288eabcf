# Shared by the QEMU guest tests (tests/vfio-guest/run.sh, tests/rxe-guest/run.sh): finding a
# Debian kernel with the modules a test needs, and copying modules into an initramfs in load
# order. Source it; every function reports through `die`, which the caller defines.

# True when the module directory $1 has a modules.dep that lists module $2 (file name, `-` or
# `_` as the kernel spells it).
guest_has_module() {
    [[ -f $1/modules.dep ]] && grep -qE "(^|/)$2\.ko(\.[a-z]+)?:" "$1/modules.dep"
}

# Sets `kernel` and `moddir` to a Debian kernel whose modules include $2, looking in this
# order: $3 and $4 (a kernel image and its module directory, from the caller's environment
# variables) if either is set; an installed /boot/vmlinuz-<v> with /lib/modules/<v>; a kernel
# unpacked earlier under $1/kernel; else the package linux-image-amd64 points to, fetched with
# `apt-get download` and unpacked under $1/kernel (no install into /boot, no initramfs or
# bootloader hooks), with modules.dep made by depmod.
guest_find_kernel() {
    local work=$1 module=$2 k v
    kernel=${3:-} moddir=${4:-}
    if [[ -n $kernel || -n $moddir ]]; then
        [[ -f $kernel ]] || die "kernel image $kernel is not a file"
        guest_has_module "$moddir" "$module" || die "$moddir has no modules.dep listing $module"
        return
    fi
    for k in $(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -rV); do
        v=${k#/boot/vmlinuz-}
        if guest_has_module "/lib/modules/$v" "$module"; then
            kernel=$k moddir=/lib/modules/$v
            return
        fi
    done
    local kroot=$work/kernel/root
    for k in $(ls -1 "$kroot"/boot/vmlinuz-* 2>/dev/null | sort -rV); do
        v=${k##*/vmlinuz-}
        if guest_has_module "$kroot/lib/modules/$v" "$module"; then
            kernel=$k moddir=$kroot/lib/modules/$v
            return
        fi
    done
    local tool
    for tool in apt-get apt-cache dpkg-deb depmod; do
        command -v "$tool" >/dev/null ||
            die "no kernel found and $tool is missing to fetch one (apt-get install kmod)"
    done
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '/Depends: linux-image-[0-9]/ && !found { print $2; found = 1 }')
    [[ -n $pkg ]] || die "apt-cache knows no linux-image-amd64; run apt-get update"
    echo "==> fetching $pkg (apt-get download + dpkg-deb -x, no install)"
    local t0 deb
    t0=$(date +%s%3N)
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
    guest_has_module "$moddir" "$module" || die "$pkg has no $module module"
    echo "    kernel $v ready in $(($(date +%s%3N) - t0)) ms"
}

# Copies the modules named after $1 (the module directory) and $2 (the initramfs root), with
# every module they need, into $2/lib/modules, and writes their load order to
# $2/modules.order: modules.dep lists every (transitive) dependency of a module, so that
# loading the list from its end works; each module comes after what it needs.
guest_pack_modules() {
    local moddir=$1 root=$2 want line self m i
    shift 2
    local -A seen=()
    local order=() deps=()
    mkdir -p "$root/lib/modules"
    for want in "$@"; do
        line=$(grep -E "(^|/)$want\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -n1) ||
            die "$want is not in $moddir/modules.dep"
        self=${line%%:*}
        read -r -a deps <<<"${line#*:}"
        for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
            [[ -n ${seen[${deps[i]}]:-} ]] || { seen[${deps[i]}]=1; order+=("${deps[i]}"); }
        done
        [[ -n ${seen[$self]:-} ]] || { seen[$self]=1; order+=("$self"); }
    done
    : >"$root/modules.order"
    for m in "${order[@]}"; do
        cp "$moddir/$m" "$root/lib/modules/"
        echo "${m##*/}" >>"$root/modules.order"
    done
}

# Packs the directory $1 into the gzip'd newc cpio archive $2.
guest_pack_initramfs() {
    (cd "$1" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 >"$2"
}

# Checks that busybox at $1 exists and is statically linked (the initramfs has no libc of its
# own for it).
guest_check_busybox() {
    [[ -x $1 ]] || die "$1 is missing (apt-get install busybox-static)"
    # ldd succeeds only on dynamically linked programs.
    if command -v ldd >/dev/null && ldd "$1" >/dev/null 2>&1; then
        die "$1 is dynamically linked; the initramfs needs busybox-static"
    fi
}
