#!/usr/bin/env bash
# Runs on the GPU machine: unpacks the carried Node and Vulkan loader, then the GPU bench.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
[ -x /tmp/node ] || python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.gpu/node.xz'), open('/tmp/node','wb'))"
chmod +x /tmp/node
export VK_DRIVER_FILES="${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}"
export __EGL_VENDOR_LIBRARY_FILENAMES="${__EGL_VENDOR_LIBRARY_FILENAMES:-/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json}"
export WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE="${WEBGPU_DEFERRED_SUBMIT_BATCH_SIZE:-200}"
/tmp/node --version
exec /tmp/node --max-old-space-size=16384 .gpu/app/gpu.mjs "$@"
