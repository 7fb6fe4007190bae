//! The password file of PostgreSQL's own tools (`~/.pgpass`, or the file `PGPASSFILE`
//! names), read as libpq reads it: lines `hostname:port:database:username:password`,
//! `*` matching anything in the first four fields, `\:` and `\\` standing for `:` and
//! `\`, `#` lines comments, the first matching line winning. A file that its group or
//! others can read or write is ignored (libpq warns and ignores it too).

use std::path::{Path, PathBuf};

/// What a connection is to, as the password file's lines are matched against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<'a> {
    pub host: &'a str,
    pub port: u16,
    pub database: &'a str,
    pub user: &'a str,
}

/// What looking in the password file found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Password(String),
    /// No file, or no line for the target.
    Nothing,
    /// The file was ignored: the warning says why and what to do.
    Ignored(String),
}

/// The password file's path: `PGPASSFILE`, else `.pgpass` in the home directory.
pub fn path(pgpassfile: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    pgpassfile.or_else(|| home.map(|home| home.join(".pgpass")))
}

/// The password for `target` in the file at `path`.
pub fn lookup(path: &Path, target: &Target<'_>) -> Lookup {
    let Ok(metadata) = std::fs::metadata(path) else {
        return Lookup::Nothing;
    };
    if !metadata.is_file() {
        return Lookup::Ignored(format!(
            "password file {} is not a plain file; it is ignored",
            path.display()
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if metadata.permissions().mode() & 0o077 != 0 {
            return Lookup::Ignored(format!(
                "password file {} has group or world access, so it is ignored, as libpq \
                 ignores it; make it yours alone: chmod 0600 {}",
                path.display(),
                path.display()
            ));
        }
    }
    match std::fs::read_to_string(path) {
        Ok(text) => find(&text, target).map_or(Lookup::Nothing, Lookup::Password),
        Err(error) => Lookup::Ignored(format!(
            "password file {} cannot be read ({error}); it is ignored",
            path.display()
        )),
    }
}

/// The password of the first line of `text` that matches `target`.
pub fn find(text: &str, target: &Target<'_>) -> Option<String> {
    let port = target.port.to_string();
    let wanted = [target.host, port.as_str(), target.database, target.user];
    text.lines()
        .map(|line| line.trim_end_matches('\r'))
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(fields)
        .find(|fields| {
            fields[..4]
                .iter()
                .zip(wanted)
                .all(|(field, wanted)| field == "*" || field == wanted || host_alias(field, wanted))
        })
        .map(|mut fields| fields.swap_remove(4))
}

/// libpq matches `localhost` in the file for a connection over a Unix socket.
fn host_alias(field: &str, wanted: &str) -> bool {
    field == "localhost" && wanted.starts_with('/')
}

/// A line's first five fields, unescaped; `None` for a line with fewer. The password
/// ends at the next unescaped `:`, as libpq reads it.
fn fields(line: &str) -> Option<Vec<String>> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut()?.push(next);
                }
            }
            ':' if fields.len() == 5 => break,
            ':' => fields.push(String::new()),
            c => fields.last_mut()?.push(c),
        }
    }
    (fields.len() == 5).then_some(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Target<'static> = Target {
        host: "db.example.com",
        port: 5432,
        database: "app",
        user: "rowsync",
    };

    #[test]
    fn the_first_matching_line_wins_with_wildcards_and_escapes() {
        let file = "# comment\n\
                    other:5432:app:rowsync:not-this\n\
                    db.example.com:5433:*:*:wrong-port\n\
                    db.example.com:*:app:rowsync:p\\:w\\\\d:tail\n\
                    *:*:*:*:catch-all\n";
        assert_eq!(find(file, &TARGET).as_deref(), Some("p:w\\d"));
        let other = Target {
            user: "someone",
            ..TARGET
        };
        assert_eq!(find(file, &other).as_deref(), Some("catch-all"));
        assert_eq!(find("db.example.com:5432:app:rowsync\n", &TARGET), None);
    }

    #[test]
    fn escaped_colons_in_the_first_fields_match_literally() {
        let target = Target {
            user: "a:b",
            ..TARGET
        };
        assert_eq!(
            find("*:*:*:a\\:b:secret\n", &target).as_deref(),
            Some("secret")
        );
        let socket = Target {
            host: "/run/postgresql",
            ..TARGET
        };
        assert_eq!(
            find("localhost:5432:app:rowsync:local\n", &socket).as_deref(),
            Some("local")
        );
    }

    #[test]
    fn a_file_others_can_read_is_ignored_with_the_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pgpass");
        std::fs::write(&file, "*:*:*:*:secret\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let Lookup::Ignored(warning) = lookup(&file, &TARGET) else {
            panic!("a 0644 file was read");
        };
        assert!(warning.contains("chmod 0600"), "{warning}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(lookup(&file, &TARGET), Lookup::Password("secret".into()));
        assert_eq!(lookup(&dir.path().join("none"), &TARGET), Lookup::Nothing);
    }
}
