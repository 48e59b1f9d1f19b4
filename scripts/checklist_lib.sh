# What the checklist scripts (checklist_op.sh, checklist_layer.sh) share: a copy of the
# workspace, patches at anchors, and the check that the compiler names exactly the files the
# checklist's next step fills. Sourced, with ROOT, WS, STEP and CHECK (the build command
# whose errors are read, as an array) set by the script.

# Copies the tracked files under the given paths of $ROOT into a fresh $WS and enters it.
copy_workspace() {
  rm -rf "$WS" && mkdir -p "$WS"
  (cd "$ROOT" && git ls-files -z -- "$@" | xargs -0 cp --parents -t "$WS")
  cd "$WS"
}

# Keeps the copy's own crates apart from the originals in the shared build directory. Cargo
# names a path package's artifacts by its path relative to the workspace root, the same in the
# copy, so the copy's would replace the originals' and look fresh to the next build there. A
# profile setting of no consequence (255 code-generation units, not 256) changes the names of
# the copy's crates only; its dependencies are still reused. Arguments: the copy's workspace
# manifest, then its packages.
separate_artifacts() {
  local manifest=$1 package
  shift
  for package in "$@"; do
    printf '\n[profile.dev.package.%s]\ncodegen-units = 255\n' "$package" >> "$manifest"
  done
}

# Inserts `text` after `anchor` (which must occur once) in `file`.
patch() {
  python3 - "$@" <<'PY'
import sys
file, anchor, text = sys.argv[1:4]
s = open(file).read()
if s.count(anchor) != 1:
    sys.exit(f"checklist: the anchor in {file} is gone or not unique: {anchor!r}")
open(file, "w").write(s.replace(anchor, anchor + text))
PY
}

# Runs CHECK; the files the errors are in must be exactly the arguments (none: it builds).
expect_errors() {
  local got
  got=$("${CHECK[@]}" --message-format short 2>&1 \
    | grep -oE '^[a-z_/]+\.rs:[0-9]+:[0-9]+: error' | cut -d: -f1 | sort -u | tr '\n' ' ' || true)
  local want=""
  [ $# -gt 0 ] && want=$(printf '%s\n' "$@" | sort -u | tr '\n' ' ')
  if [ "$got" != "$want" ]; then
    echo "checklist: after '$STEP' the compiler named [${got}], the checklist [${want}]"
    exit 1
  fi
  echo "checklist: after '$STEP' the compiler names [${got}]"
}
