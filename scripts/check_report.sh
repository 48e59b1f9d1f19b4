#!/usr/bin/env bash
# `kiln report` in a real browser (issue 30): headless Chromium renders the report of the
# tour's training step; the page's own script follows every link between its sections and must
# find each target; the page and a screenshot are kept in target/ci-artifacts/.
# Usage: scripts/check_report.sh [PROGRAM.kir]   (default: kiln-out/train_step.kir)
set -euo pipefail
cd "$(dirname "$0")/.."
program=${1:-kiln-out/train_step.kir}
out=target/ci-artifacts
mkdir -p "$out"
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || { echo "no chromium: install Debian's chromium package"; exit 1; }
cargo run --release --locked --quiet -- report "$program" --bind N=32 -o "$out/report.html"
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars)
dom=$(timeout 180 "$browser" "${flags[@]}" --dump-dom "file://$PWD/$out/report.html" 2>/dev/null)
check=$(grep -o '<p id="self-check">[^<]*' <<<"$dom" | sed 's/.*>//' || true)
echo "report in Chromium: ${check:-no self-check paragraph}"
if ! [[ $check =~ ^links:\ ([0-9]+)\ of\ ([0-9]+)\ resolve$ ]] \
  || [ "${BASH_REMATCH[1]}" != "${BASH_REMATCH[2]}" ] || [ "${BASH_REMATCH[2]}" -lt 10 ]; then
  echo "the report's links do not all work in Chromium"
  exit 1
fi
sections=$(grep -o '<section id="pass-[0-9]*"' <<<"$dom" | wc -l)
[ "$sections" -ge 10 ] || { echo "the rendered report has $sections pass sections, not 10"; exit 1; }
timeout 180 "$browser" "${flags[@]}" --window-size=1280,2400 --screenshot="$PWD/$out/report.png" \
  "file://$PWD/$out/report.html" >/dev/null 2>&1
[ -s "$out/report.png" ] || { echo "no screenshot"; exit 1; }
echo "kept $out/report.html and $out/report.png"
