# Sourced by the recipes: where the repo, the shared models/data and the outputs
# are, the `verl` command, the SMOKE switch, and a clean skip.
RECIPES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$RECIPES/.." && pwd)"
VERL="${VERL:-node $ROOT/bin/verl.js}"
SHARED="${VERL_SHARED_DIR:-$ROOT/../shared}"
SMOKE="${SMOKE:-0}"
OUTPUTS="${OUTPUTS:-$ROOT/outputs}"

if [ "$VERL" = "node $ROOT/bin/verl.js" ] && [ ! -f "$ROOT/dist/src/cli/main.js" ]; then
  echo "build first: npm run build" >&2
  exit 2
fi

# skip "why": a recipe whose inputs are absent exits 0 with one clear line.
skip() {
  echo "SKIP $(basename "$(dirname "$0")")/$(basename "$0"): $*" >&2
  exit 0
}

# fresh_dir DIR: an empty folder (smoke runs start clean, so resume_mode=auto finds nothing).
fresh_dir() {
  rm -rf "$1" && mkdir -p "$1"
}
