//! include/rowsync.h is what cbindgen makes of the crate now. `ROWSYNC_BLESS=1` rewrites
//! it after an API change.

use std::path::Path;

#[test]
fn the_committed_header_is_what_cbindgen_generates() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut generated = Vec::new();
    cbindgen::generate(crate_dir)
        .expect("cbindgen reads the crate")
        .write(&mut generated);
    let path = crate_dir.join("include/rowsync.h");
    if std::env::var_os("ROWSYNC_BLESS").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} differs from what cbindgen generates; run with ROWSYNC_BLESS=1 and commit it",
        path.display()
    );
}
