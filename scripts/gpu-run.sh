#!/usr/bin/env bash
# Runs on the GPU machine (after scripts/gpu-bundle.sh here; carry [".gpu", ".gl"]): unpacks
# the carried Node and Vulkan loader, then one of
#   bash scripts/gpu-run.sh bench [args]        the GPU benchmark (dist/bench/gpu.js)
#   bash scripts/gpu-run.sh verl train ...      the verl CLI from the bundle
#   bash scripts/gpu-run.sh node FILE.js ...    any compiled script of the bundle, path relative to .gpu/app
# (no mode word: the benchmark, as before). Node runs from the repository root, so relative
# paths in overrides (.gpu/stories260K/..., outputs/...) resolve there.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
[ -x /tmp/node ] || python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.gpu/node.xz'), open('/tmp/node','wb'))"
chmod +x /tmp/node
dawn=.gpu/app/node_modules/webgpu/dist/linux-x64/dawn.node
# dawn.node is only needed for trainer.device=webgpu: a bundle may leave it out to fit the carry limit
[ -f "$dawn" ] || [ ! -f .gpu/dawn.node.xz ] || python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open('.gpu/dawn.node.xz'), open(sys.argv[1],'wb'))" "$dawn"
export VK_DRIVER_FILES="${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}"
export __EGL_VENDOR_LIBRARY_FILENAMES="${__EGL_VENDOR_LIBRARY_FILENAMES:-/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json}"
/tmp/node --version >&2
# VERL_NODE_FLAGS: extra flags for Node (e.g. --cpu-prof --cpu-prof-dir=DIR; NODE_OPTIONS refuses --cpu-prof)
read -r -a EXTRA_FLAGS <<< "${VERL_NODE_FLAGS:-}"
NODE=(/tmp/node --max-old-space-size=16384 "${EXTRA_FLAGS[@]}")
case "${1:-bench}" in
  verl) shift; exec "${NODE[@]}" .gpu/app/bin/verl.js "$@" ;;
  node) shift; f="$1"; shift; exec "${NODE[@]}" ".gpu/app/$f" "$@" ;;
  bench) [ $# -gt 0 ] && shift; exec "${NODE[@]}" .gpu/app/dist/bench/gpu.js "$@" ;;
  *) exec "${NODE[@]}" .gpu/app/dist/bench/gpu.js "$@" ;;
esac
