//! `rowsync user`: the built-in users (`rs_user`): add, list, set a password, disable,
//! enable, remove.

use std::io::{IsTerminal, Read};

use anyhow::{bail, Context, Result};
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_server::auth;

#[derive(clap::Subcommand)]
pub enum UserCommand {
    /// Add a user, or set the password of an existing one (asked for at a terminal,
    /// else read from standard input).
    Add(UserAddArgs),
    /// List the users: name, enabled or disabled, when added.
    List(UserListArgs),
    /// Set the password of an existing user (asked for at a terminal, else read from
    /// standard input).
    SetPassword(UserAddArgs),
    /// Refuse a user's password logins from now on, as a wrong password is refused;
    /// its client ids and rows stay.
    Disable(UserNameArgs),
    /// Take a disabled user's password logins again.
    Enable(UserNameArgs),
    /// Remove a user; its client ids stay and come back to it if the name is added again.
    Remove(UserNameArgs),
}

#[derive(clap::Args)]
pub struct UserListArgs {
    #[command(flatten)]
    database: DatabaseArg,
}

#[derive(clap::Args)]
pub struct UserNameArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// The user's name.
    #[arg(long)]
    name: String,
}

/// What `disable`, `enable` and `remove` do to the user named.
#[derive(Clone, Copy)]
enum UserChange {
    Disable,
    Enable,
    Remove,
}

struct ChangeUser {
    args: UserNameArgs,
    change: UserChange,
}

struct ListUsers;

/// `add` (upsert) or `set-password` (the user must exist).
struct SavePassword {
    args: UserAddArgs,
    must_exist: bool,
}

#[derive(clap::Args)]
pub struct UserAddArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// The user's name: what the client logs in as, and what the default scripts match
    /// against the partition column.
    #[arg(long)]
    name: String,
    /// The password (visible to other users of the machine in the process list: prefer
    /// the prompt, or standard input). When absent: asked for twice at a terminal, with
    /// echo off; else standard input, without its trailing newline.
    #[arg(long, env = "ROWSYNC_PASSWORD", hide_env_values = true)]
    password: Option<String>,
}

pub async fn run(command: UserCommand) -> Result<()> {
    match command {
        UserCommand::Add(args) => save(args, false).await,
        UserCommand::SetPassword(args) => save(args, true).await,
        UserCommand::List(args) => args.database.database()?.run(ListUsers).await,
        UserCommand::Disable(args) => change(args, UserChange::Disable).await,
        UserCommand::Enable(args) => change(args, UserChange::Enable).await,
        UserCommand::Remove(args) => change(args, UserChange::Remove).await,
    }
}

async fn save(args: UserAddArgs, must_exist: bool) -> Result<()> {
    let database = args.database.database()?;
    database.run(SavePassword { args, must_exist }).await
}

async fn change(args: UserNameArgs, change: UserChange) -> Result<()> {
    let database = args.database.database()?;
    database.run(ChangeUser { args, change }).await
}

impl OnBackend for ListUsers {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        for user in connection.users().await? {
            let state = if user.disabled { "disabled" } else { "enabled" };
            println!("{}\t{state}\t{}", user.name, user.created_at);
        }
        Ok(())
    }
}

impl OnBackend for ChangeUser {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        let name = &self.args.name;
        let (found, done) = match self.change {
            UserChange::Disable => (connection.set_user_disabled(name, true).await?, "disabled"),
            UserChange::Enable => (connection.set_user_disabled(name, false).await?, "enabled"),
            UserChange::Remove => (connection.remove_user(name).await?, "removed"),
        };
        if !found {
            bail!("there is no user {name:?}; `rowsync user list` shows the users");
        }
        println!("user {name} {done}");
        Ok(())
    }
}

impl OnBackend for SavePassword {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let SavePassword { args, must_exist } = self;
        let password = match args.password {
            Some(password) => password,
            None => read_password(&args.name)?,
        };
        if password.is_empty() {
            bail!("the password must not be empty");
        }
        let hash =
            auth::hash_password(&password).map_err(|error| anyhow::anyhow!("hashing: {error}"))?;
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        if must_exist
            && !connection
                .users()
                .await?
                .iter()
                .any(|user| user.name == args.name)
        {
            bail!(
                "there is no user {:?}; add it with `rowsync user add --name {}`",
                args.name,
                args.name
            );
        }
        connection.set_user(&args.name, &hash).await?;
        println!("user {} saved", args.name);
        Ok(())
    }
}

/// The password, asked for twice with echo off when standard input is a terminal, else
/// read from it (a pipe, a file) without its trailing newline.
fn read_password(name: &str) -> Result<String> {
    if !std::io::stdin().is_terminal() {
        let mut input = String::new();
        std::io::stdin()
            .read_to_string(&mut input)
            .context("reading the password from standard input")?;
        return Ok(input.trim_end_matches(['\r', '\n']).to_string());
    }
    let asking = |prompt: String| {
        rpassword::prompt_password(prompt).context("reading the password from the terminal")
    };
    let password = asking(format!("password for {name}: "))?;
    if password.is_empty() {
        bail!("the password must not be empty");
    }
    if asking(format!("password for {name} again: "))? != password {
        bail!("the two passwords differ; nothing was saved: run the command again");
    }
    Ok(password)
}
