#!/usr/bin/env bash
# Builds the browser page into web/dist/: the crate compiled to wasm32 with wgpu's WebGPU
# backend (web/crate), its JavaScript glue from wasm-bindgen, optimised by wasm-opt when there
# is one, and the page's own files. Prints the wasm's size, raw and gzipped.
#
# Needs: rustup target add wasm32-unknown-unknown; cargo install wasm-bindgen-cli --version V
# (V: the wasm-bindgen in web/crate/Cargo.lock). wasm-opt is optional (PATH, or
# web/test/node_modules/.bin from npm's `binaryen`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
dist="$here/dist"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/wasm}"

want=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' "$here/crate/Cargo.lock")
have=$(wasm-bindgen --version 2>/dev/null | awk '{ print $2 }') || true
if [ "$have" != "$want" ]; then
    echo "build.sh: wasm-bindgen CLI ${have:-missing}, the crate needs $want:" >&2
    echo "  cargo install wasm-bindgen-cli --version $want" >&2
    exit 1
fi

(cd "$here/crate" && cargo build --release --target wasm32-unknown-unknown)
rm -rf "$dist"
mkdir -p "$dist/pkg"
wasm-bindgen --target web --no-typescript --out-dir "$dist/pkg" \
    "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/wgpu_attention_web.wasm"
wasm="$dist/pkg/wgpu_attention_web_bg.wasm"

opt=$(command -v wasm-opt || true)
[ -z "$opt" ] && [ -x "$here/test/node_modules/.bin/wasm-opt" ] && opt="$here/test/node_modules/.bin/wasm-opt"
if [ -n "$opt" ]; then
    "$opt" -Os --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext \
        --enable-mutable-globals --enable-reference-types --enable-multivalue \
        "$wasm" -o "$wasm.opt" && mv "$wasm.opt" "$wasm"
    echo "wasm-opt: $opt"
else
    echo "wasm-opt: not found (optional; npm install binaryen in web/test), skipped"
fi

cp "$here/index.html" "$here/main.js" "$here/draw.js" "$here/style.css" "$dist/"
raw=$(stat -c %s "$wasm")
gz=$(gzip -9 -c "$wasm" | wc -c)
awk -v d="$dist" -v r="$raw" -v g="$gz" 'BEGIN { printf "web/dist: %s\nwasm: %d bytes raw (%.2f MB), %d bytes gzipped (%.2f MB; goal < 1.5 MB)\n", d, r, r / 1e6, g, g / 1e6 }'
