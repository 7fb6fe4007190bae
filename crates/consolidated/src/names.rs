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
