#!/usr/bin/env bash
# Builds the spike: wasm (cargo) -> JS glue (wasm-bindgen) -> wasm-opt, into web/pkg.
# Needs: rustup target wasm32-unknown-unknown, clang (Debian `clang`, 14 works),
# tools/bin/wasm-bindgen (cargo install wasm-bindgen-cli --version =0.2.130 --root tools),
# node_modules (npm install playwright-core@1.65.1 binaryen@132.0.0).
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="$PWD/target" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"
out="${OUT:-web}"
nice -n 19 cargo build --release --target wasm32-unknown-unknown "$@"
tools/bin/wasm-bindgen --target web --out-dir "$out/pkg" target/wasm32-unknown-unknown/release/rowsync_wasm_spike.wasm
node_modules/.bin/wasm-opt -Os "$out/pkg/rowsync_wasm_spike_bg.wasm" -o "$out/pkg/rowsync_wasm_spike_bg.wasm"
ls -l "$out/pkg/rowsync_wasm_spike_bg.wasm"
# Run: python3 serve.py 8765 web &   then   node drive.mjs /tmp/profile write; node drive.mjs /tmp/profile restart
