//! Settings from a TOML file (`--config FILE`) and from `ROWSYNC_*` environment
//! variables, for every option of every command: a key of the file is an option's long
//! name with `_` for `-` (`max_connections = 1024` for `--max-connections 1024`), its
//! variable that name in capitals (`ROWSYNC_MAX_CONNECTIONS`). An option given on the
//! command line wins, then the environment, then the file, then the default.
//!
//! The file and the environment are folded into the command line before clap reads it,
//! so every option is checked, parsed and documented once, by clap.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::ArgAction;

/// Where an option's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    CommandLine,
    Environment,
    File,
}

/// One option of the command run, with its value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The key of the file (`max_connections`).
    pub key: String,
    pub values: Vec<String>,
    pub source: Source,
}

/// The command line `argv` with the options it lacks taken from the environment and
/// from the file its `--config` names, and what each option of the command is set to.
pub fn fold_in(root: &clap::Command, argv: Vec<OsString>) -> Result<(Vec<OsString>, Vec<Setting>)> {
    let words: Vec<String> = argv
        .iter()
        .map(|word| word.to_string_lossy().into_owned())
        .collect();
    let (command, path) = command_named(root, &words);
    if path.first().is_some_and(|name| name == "config") {
        // `config check` folds in for the command it checks.
        return Ok((argv, Vec::new()));
    }
    let file = match config_path(&words) {
        Some(path) => read_file(&path)?,
        None => BTreeMap::new(),
    };
    // The root's global options (`--log-format`) are every command's.
    let globals = root
        .get_arguments()
        .filter(|arg| arg.is_global_set() && !path.is_empty());
    let options: Vec<&clap::Arg> = command
        .get_arguments()
        .chain(globals)
        .filter(|arg| arg.get_long().is_some_and(|long| long != "config"))
        .filter(|arg| !matches!(arg.get_action(), ArgAction::Help | ArgAction::Version))
        .collect();
    let known: Vec<String> = options.iter().map(|arg| key_of(arg)).collect();
    if let Some(unknown) = file.keys().find(|key| !known.contains(key)) {
        bail!(
            "the config file names {unknown:?}, which `rowsync {}` does not take{}",
            path.join(" "),
            nearest(unknown, &known)
                .map_or(String::new(), |key| format!("; did you mean {key:?}?"))
        );
    }
    let mut folded = argv;
    let mut settings = Vec::new();
    for arg in options {
        let key = key_of(arg);
        let long = arg.get_long().expect("filtered above");
        let (values, source) = if let Some(values) = given(&words, long) {
            (values, Source::CommandLine)
        } else if let Ok(value) = std::env::var(format!("ROWSYNC_{}", key.to_uppercase())) {
            (vec![value], Source::Environment)
        } else if let Some(value) = file.get(&key) {
            (file_values(value, &key)?, Source::File)
        } else {
            continue;
        };
        if source != Source::CommandLine {
            folded.extend(as_words(arg, long, &values));
        }
        settings.push(Setting {
            key,
            values,
            source,
        });
    }
    Ok((folded, settings))
}

/// The subcommand `words` run (the deepest one named), and its path of names.
fn command_named<'c>(
    root: &'c clap::Command,
    words: &[String],
) -> (&'c clap::Command, Vec<String>) {
    let mut command = root;
    let mut path = Vec::new();
    for word in words.iter().skip(1) {
        if word.starts_with('-') {
            continue;
        }
        match command.find_subcommand(word) {
            Some(sub) => {
                command = sub;
                path.push(word.clone());
            }
            None => break,
        }
    }
    (command, path)
}

fn config_path(words: &[String]) -> Option<PathBuf> {
    given(words, "config")
        .and_then(|values| values.into_iter().next())
        .or_else(|| std::env::var("ROWSYNC_CONFIG").ok())
        .map(PathBuf::from)
}

/// The values `--long` has on the command line (`--long V`, `--long=V`; a flag: none),
/// if it is there.
fn given(words: &[String], long: &str) -> Option<Vec<String>> {
    let flag = format!("--{long}");
    let mut values = None;
    let mut words = words.iter();
    while let Some(word) = words.next() {
        if word == &flag {
            let list = values.get_or_insert_with(Vec::new);
            if let Some(next) = words.clone().next().filter(|next| !next.starts_with("--")) {
                list.push(next.clone());
            }
        } else if let Some(value) = word.strip_prefix(&format!("{flag}=")) {
            values.get_or_insert_with(Vec::new).push(value.to_string());
        }
    }
    values
}

fn key_of(arg: &clap::Arg) -> String {
    arg.get_long().unwrap_or_default().replace('-', "_")
}

fn read_file(path: &Path) -> Result<BTreeMap<String, toml::Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the config file {}", path.display()))?;
    let table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("the config file {} is not TOML", path.display()))?;
    Ok(table
        .into_iter()
        .map(|(key, value)| (key.replace('-', "_"), value))
        .collect())
}

/// A file value as command-line words: text as is, numbers and booleans written out,
/// a list one value each; a table is refused.
fn file_values(value: &toml::Value, key: &str) -> Result<Vec<String>> {
    Ok(match value {
        toml::Value::String(text) => vec![text.clone()],
        toml::Value::Integer(number) => vec![number.to_string()],
        toml::Value::Float(number) => vec![number.to_string()],
        toml::Value::Boolean(flag) => vec![flag.to_string()],
        toml::Value::Array(items) => {
            let mut values = Vec::new();
            for item in items {
                values.extend(file_values(item, key)?);
            }
            values
        }
        other => bail!(
            "the config file's {key} is a {}, not a value",
            other.type_str()
        ),
    })
}

/// An option's values as the command line would give them: a flag (`SetTrue`) is
/// there or not (`true` or `false`), any other option once per value.
fn as_words(arg: &clap::Arg, long: &str, values: &[String]) -> Vec<OsString> {
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => match values.first().map(String::as_str) {
            Some("true" | "1" | "yes" | "on") => vec![format!("--{long}").into()],
            _ => Vec::new(),
        },
        _ => values
            .iter()
            .map(|value| OsString::from(format!("--{long}={value}")))
            .collect(),
    }
}

/// The known key closest to `unknown`, if one is close.
fn nearest<'k>(unknown: &str, known: &'k [String]) -> Option<&'k str> {
    known
        .iter()
        .map(|key| (strsim::jaro_winkler(unknown, key), key))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, key)| key.as_str())
}

/// A setting as `rowsync config check` prints it: secrets masked (a key naming a
/// password, secret, token or key file's contents; a URL's password).
pub fn shown(setting: &Setting) -> String {
    let secret = ["password", "secret", "token"]
        .iter()
        .any(|word| setting.key.contains(word) && !setting.key.ends_with("_file"));
    let values: Vec<String> = setting
        .values
        .iter()
        .map(|value| match secret {
            true => "********".to_string(),
            false => crate::database::without_password(value),
        })
        .collect();
    let source = match setting.source {
        Source::CommandLine => "command line",
        Source::Environment => "environment",
        Source::File => "config file",
    };
    format!("{} = {}    # {source}", setting.key, values.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn options_on_the_command_line_are_found_in_both_spellings() {
        let line = words("rowsync serve --db a.db --workers=4 --tls");
        assert_eq!(given(&line, "db"), Some(vec!["a.db".to_string()]));
        assert_eq!(given(&line, "workers"), Some(vec!["4".to_string()]));
        assert_eq!(given(&line, "tls"), Some(vec![]));
        assert_eq!(given(&line, "listen"), None);
    }

    #[test]
    fn a_url_password_is_masked() {
        assert_eq!(
            crate::database::without_password("postgres://app:s3cret@db:5432/app?sslmode=require"),
            "postgres://app:********@db:5432/app?sslmode=require"
        );
        assert_eq!(
            crate::database::without_password("central.db"),
            "central.db"
        );
        assert_eq!(
            crate::database::without_password("postgres://app@db/app"),
            "postgres://app@db/app"
        );
    }

    #[test]
    fn a_misspelt_key_gets_the_nearest_one() {
        let known = vec!["max_connections".to_string(), "workers".to_string()];
        assert_eq!(nearest("max_conections", &known), Some("max_connections"));
        assert_eq!(nearest("colour", &known), None);
    }
}
