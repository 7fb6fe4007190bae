//! The names rowsync gives what it adds to a synchronized table on MySQL and MariaDB:
//! beneath `schema`, which installs them, and `stamp`, which writes the watermark there.

/// Columns rowsync adds to a synchronized table (invisible to `SELECT *`).
pub const STAMP_COLUMN: &str = "rs_stamp";
pub const ORIGIN_COLUMN: &str = "rs_origin";

/// The table of a synchronized table's deleted rows.
pub fn tombstone_table(table: &str) -> String {
    format!("rs_tombstone_{table}")
}
