/// Quotes an SQL identifier (`"name"`, inner quotes doubled). Every table and column
/// name rowsync puts into generated SQL goes through here; values never do, they are
/// always bound as parameters.
pub fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `p."a", p."b"`: quoted names, each with a prefix (an alias and a dot, or nothing).
pub(crate) fn column_list(
    names: impl IntoIterator<Item = impl AsRef<str>>,
    prefix: &str,
) -> String {
    names
        .into_iter()
        .map(|name| format!("{prefix}{}", quote_identifier(name.as_ref())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `l."k1" = r."k1" AND l."k2" = r."k2"`: two aliases matched on the key columns.
pub(crate) fn key_match(keys: &[String], left: &str, right: &str) -> String {
    keys.iter()
        .map(|key| format!("{left}.{k} = {right}.{k}", k = quote_identifier(key)))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// `SELECT "a", "b" FROM <table> WHERE "k" = $1`: the columns of the row with a key,
/// the key's values bound by position, each written by `placeholder` from its 1-based
/// position (`$1` on PostgreSQL, `?1` on SQLite, `?` on MySQL).
pub(crate) fn select_by_key(
    table: &str,
    columns: &[String],
    key_positions: &[usize],
    placeholder: impl Fn(usize) -> String,
) -> String {
    let matches = key_positions
        .iter()
        .enumerate()
        .map(|(index, &position)| {
            format!(
                "{} = {}",
                quote_identifier(&columns[position]),
                placeholder(index + 1)
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ");
    format!(
        "SELECT {} FROM {table} WHERE {matches}",
        column_list(columns, "")
    )
}
