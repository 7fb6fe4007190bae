//! The durability modes through the C ABI: each mode opens, writes through
//! `rowsync_execute` and persists; the memory mode's data reaches its file only when
//! persisted, and cannot have `durable_before_sync` turned off.

use std::ffi::{CStr, CString};

use rowsync::{
    rowsync_close, rowsync_durability, rowsync_execute, rowsync_last_error, rowsync_open_with,
    rowsync_persist, rowsync_set_durable_before_sync, rowsync_status,
};

fn rows_in_file(path: &std::path::Path) -> i64 {
    let connection = rusqlite::Connection::open(path).unwrap();
    connection
        .query_row("SELECT count(*) FROM notes", [], |row| row.get(0))
        .unwrap_or(-1)
}

#[test]
fn every_mode_writes_and_persists_through_the_c_abi() {
    use rowsync_durability::*;
    let dir = tempfile::tempdir().unwrap();
    for (index, mode) in [
        ROWSYNC_DURABILITY_FULL,
        ROWSYNC_DURABILITY_NORMAL,
        ROWSYNC_DURABILITY_OFF,
        ROWSYNC_DURABILITY_MEMORY,
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("mode-{index}.db"));
        let path_c = CString::new(path.to_str().unwrap()).unwrap();
        let sql = c"CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes VALUES (1, 'a');";
        unsafe {
            let mut client = std::ptr::null_mut();
            let status =
                rowsync_open_with(path_c.as_ptr(), std::ptr::null(), mode as i32, &mut client);
            assert_eq!(status, rowsync_status::ROWSYNC_OK, "{mode:?}");
            assert_eq!(
                rowsync_execute(client, sql.as_ptr()),
                rowsync_status::ROWSYNC_OK
            );
            let before_persist = rows_in_file(&path);
            assert_eq!(rowsync_persist(client), rowsync_status::ROWSYNC_OK);
            assert_eq!(rows_in_file(&path), 1, "{mode:?}");
            let turned_off = rowsync_set_durable_before_sync(client, false);
            if mode == ROWSYNC_DURABILITY_MEMORY {
                // Only the copy holds the data, and only from the persist on.
                assert_eq!(before_persist, -1);
                assert_eq!(turned_off, rowsync_status::ROWSYNC_ERROR);
                let message = CStr::from_ptr(rowsync_last_error()).to_str().unwrap();
                assert!(message.contains("durable_before_sync"), "{message}");
            } else {
                assert_eq!(before_persist, 1, "{mode:?}: every commit reaches the file");
                assert_eq!(turned_off, rowsync_status::ROWSYNC_OK);
            }
            assert_eq!(
                rowsync_execute(client, c"NOT SQL".as_ptr()),
                rowsync_status::ROWSYNC_ERROR
            );
            rowsync_close(client);
        }
    }
    let path = CString::new(dir.path().join("bad.db").to_str().unwrap()).unwrap();
    let mut client = std::ptr::null_mut();
    let status = unsafe { rowsync_open_with(path.as_ptr(), std::ptr::null(), 7, &mut client) };
    assert_eq!(status, rowsync_status::ROWSYNC_INVALID_ARGUMENT);
    assert!(client.is_null());
}
