//! The password in the MySQL and MariaDB clients' option file `~/.my.cnf`, read as they
//! read it: `password = ...` in the `[client]` group (or MariaDB's `[client-mariadb]`),
//! the last one found winning, the value optionally quoted with the escapes `\\`, `\n`,
//! `\t`, `\r`, `\b`, `\s` (a space); `#` and `;` lines comments. A world-writable file is
//! ignored (the clients warn and ignore it too).

use std::path::Path;

/// What reading the option file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Password(String),
    /// No file, or no password in it.
    Nothing,
    /// The file was ignored: the warning says why and what to do.
    Ignored(String),
}

/// The `[client]` password of the option file at `path`.
pub fn lookup(path: &Path) -> Lookup {
    let Ok(metadata) = std::fs::metadata(path) else {
        return Lookup::Nothing;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if metadata.permissions().mode() & 0o002 != 0 {
            return Lookup::Ignored(format!(
                "option file {} is world-writable, so it is ignored, as the mysql client \
                 ignores it; make it yours alone: chmod 0600 {}",
                path.display(),
                path.display()
            ));
        }
    }
    let _ = metadata;
    match std::fs::read_to_string(path) {
        Ok(text) => password(&text).map_or(Lookup::Nothing, Lookup::Password),
        Err(error) => Lookup::Ignored(format!(
            "option file {} cannot be read ({error}); it is ignored",
            path.display()
        )),
    }
}

/// The last `password` of the client groups in `text`.
pub fn password(text: &str) -> Option<String> {
    let mut in_client_group = false;
    let mut found = None;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(group) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let group = group.trim().to_ascii_lowercase();
            in_client_group = group == "client" || group == "client-mariadb";
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if in_client_group && key.trim().replace('_', "-") == "password" {
            found = Some(unquoted(value.trim()));
        }
    }
    found
}

/// A value without its quotes, its escapes replaced.
fn unquoted(value: &str) -> String {
    let quoted = value.len() >= 2
        && (value.starts_with('"') && value.ends_with('"')
            || value.starts_with('\'') && value.ends_with('\''));
    let value = if quoted {
        &value[1..value.len() - 1]
    } else {
        value.split(" #").next().unwrap_or(value).trim_end()
    };
    let mut text = String::new();
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            text.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => text.push('\n'),
            Some('t') => text.push('\t'),
            Some('r') => text.push('\r'),
            Some('b') => text.push('\u{8}'),
            Some('s') => text.push(' '),
            Some(other) => text.push(other),
            None => text.push('\\'),
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_groups_password_is_taken_unquoted() {
        let file = "[mysqld]\npassword = not-this\n\n# comment\n[client]\nuser = app\n\
                    password = \"pa ss\\\\w#rd\"\n[client-mariadb]\npassword=last\n";
        assert_eq!(password(file).as_deref(), Some("last"));
        let file = "[client]\npassword = plain # a comment\n";
        assert_eq!(password(file).as_deref(), Some("plain"));
        let file = "[client]\npassword = 'pa ss\\\\w#rd'\n[mysql]\npassword=other\n";
        assert_eq!(password(file).as_deref(), Some("pa ss\\w#rd"));
        assert_eq!(password("[mysqldump]\npassword = x\n"), None);
    }

    #[test]
    fn a_world_writable_file_is_ignored_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(".my.cnf");
        std::fs::write(&file, "[client]\npassword=secret\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let Lookup::Ignored(warning) = lookup(&file) else {
            panic!("a world-writable file was read");
        };
        assert!(warning.contains("chmod 0600"), "{warning}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(lookup(&file), Lookup::Password("secret".into()));
    }
}
