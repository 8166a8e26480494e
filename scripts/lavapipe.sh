#!/usr/bin/env bash
# Runs a command with WebGPU on Mesa's lavapipe (Vulkan on the CPU) with subgroup matrices: the
# tensor-core kernels on a machine without a GPU. Lavapipe has VK_KHR_cooperative_matrix (f16 x
# f16 -> f32 at 8 x 8 x 8, subgroups of 8) from Mesa 25.x built with a recent LLVM; Debian 12's
# Mesa (22.3, and 25.0 in its backports, LLVM 15) has none. So this fetches Debian unstable's Mesa
# and the C library it needs into .lavapipe/ (never committed; about 430 MB, once), and puts first
# on PATH a copy of this Node whose ELF interpreter and library path are that C library's: Node
# and what it loads (dawn.node, the Vulkan loader, lavapipe) run on them, every other program on
# the system's, so recipes and their shells work as usual.
#   bash scripts/lavapipe.sh node --test dist/test/models/lora_merged.test.js
#   bash scripts/lavapipe.sh node dist/bench/gpu_gemm.js --only adapter
#   bash scripts/lavapipe.sh bash recipes/stories_grpo/run.sh trainer.device=webgpu ...
# Needs: curl, xz, python3, dpkg-deb (or ar + tar), patchelf, and deb.debian.org. The kernels see
# 8 x 8 fragments and run each 16 x 16 one as four (src/engine/subgroup_fragments.ts); lavapipe
# compiles a product's pipeline in ~10 s, so keep tests small. Timings here say nothing about a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${VERL_LAVAPIPE_DIR:-$PWD/.lavapipe}"
SUITE="${VERL_LAVAPIPE_SUITE:-sid}"
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
if [ -n "$exclude" ]; then mkdir -p "$(dirname "$exclude")"; grep -qxF '/.lavapipe/' "$exclude" 2>/dev/null || echo '/.lavapipe/' >> "$exclude"; fi

if [ ! -x "$ROOT/bin/node" ]; then
  for tool in curl xz python3 patchelf; do
    command -v "$tool" >/dev/null || { echo "scripts/lavapipe.sh: needs $tool (e.g. apt-get install $tool)" >&2; exit 2; }
  done
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "scripts/lavapipe.sh: fetching Debian $SUITE's mesa-vulkan-drivers and its libraries into $ROOT" >&2
  curl -fsS "http://deb.debian.org/debian/dists/$SUITE/main/binary-amd64/Packages.xz" | xz -d > "$tmp/Packages"
  # the packages' closure over Depends (first alternative each), as pool paths
  python3 - "$tmp/Packages" > "$tmp/files" <<'PY'
import sys
index, cur = {}, {}
for line in open(sys.argv[1], encoding="utf-8"):
    if line == "\n":
        if "Package" in cur: index.setdefault(cur["Package"], cur)
        cur = {}
    elif not line[0].isspace():
        k, _, v = line.partition(":"); cur[k] = v.strip()
seen, todo = set(), ["mesa-vulkan-drivers", "libvulkan1", "libc6", "libstdc++6", "libgcc-s1"]
while todo:
    name = todo.pop()
    if name in seen: continue
    if name not in index: sys.exit(f"scripts/lavapipe.sh: package {name} is not in the index")
    seen.add(name)
    for field in ("Depends", "Pre-Depends"):
        for dep in filter(None, (d.strip() for d in index[name].get(field, "").split(","))):
            todo.append(dep.split("|")[0].strip().split(" ")[0].split(":")[0])
print("\n".join(index[n]["Filename"] for n in sorted(seen)))
PY
  mkdir -p "$tmp/debs" "$tmp/root/bin"
  while read -r f; do curl -fsS -o "$tmp/debs/$(basename "$f")" "http://deb.debian.org/debian/$f"; done < "$tmp/files"
  for d in "$tmp"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$d" "$tmp/root"
    else (cd "$tmp" && ar x "$d" && tar xf data.tar.* -C "$tmp/root" && rm -f data.tar.* control.tar.* debian-binary); fi
  done
  [ -f "$tmp/root/usr/lib64/ld-linux-x86-64.so.2" ] || { echo "scripts/lavapipe.sh: no loader in the fetched libc6" >&2; exit 2; }
  lib="$ROOT/usr/lib/x86_64-linux-gnu"
  cp "$(command -v node)" "$tmp/root/bin/node"
  # DT_RPATH (not RUNPATH) on the executable: it also serves dlopen from objects without a path of their own
  patchelf --set-interpreter "$ROOT/usr/lib64/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib:$ROOT/lib/x86_64-linux-gnu" "$tmp/root/bin/node"
  # LLVM's own RUNPATH ($ORIGIN/../lib) would hide the executable's path from its dependencies
  for so in "$tmp"/root/usr/lib/x86_64-linux-gnu/libLLVM*.so.*; do [ -L "$so" ] || patchelf --set-rpath '$ORIGIN' "$so"; done
  sed "s#\"library_path\": *\"libvulkan_lvp.so\"#\"library_path\": \"$lib/libvulkan_lvp.so\"#" \
    "$tmp/root/usr/share/vulkan/icd.d/lvp_icd.json" > "$tmp/root/lvp_icd.json"
  rm -rf "$ROOT" && mkdir -p "$(dirname "$ROOT")" && mv "$tmp/root" "$ROOT"
fi

export PATH="$ROOT/bin:$PATH"
export VK_ICD_FILENAMES="$ROOT/lvp_icd.json"
export VERL_DAWN_FLAGS="${VERL_DAWN_FLAGS:-backend=vulkan,enable-dawn-features=allow_unsafe_apis}"
exec "$@"
