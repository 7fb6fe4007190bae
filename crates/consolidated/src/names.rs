/// Quotes an SQL identifier (`"name"`, inner quotes doubled). Every table and column
/// name rowsync puts into generated SQL goes through here; values never do, they are
/// always bound as parameters.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
