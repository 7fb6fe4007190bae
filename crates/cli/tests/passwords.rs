//! Passwords and secrets (issue 36, item 5): `rowsync user add` asks at a terminal with
//! echo off (and still reads a pipe); a PostgreSQL URL without a password takes
//! `PGPASSWORD`, else `PGPASSFILE` or `~/.pgpass` as libpq reads them, against a real
//! cluster that wants a password; a MariaDB URL takes `~/.my.cnf` or `MYSQL_PWD`. No
//! message shows a password.

mod support;

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use support::rowsync;

/// The cluster's superuser password: a `:` and a `\` for the password file's escapes.
const PASSWORD: &str = "pg:pa\\ss-Word";

fn run(args: &[&str], environment: &[(&str, &str)]) -> Output {
    rowsync()
        .args(args)
        .env_remove("PGPASSWORD")
        .env_remove("PGPASSFILE")
        .env_remove("MYSQL_PWD")
        .env("HOME", "/nonexistent")
        .envs(environment.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn write_private(path: &std::path::Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_postgres_url_without_a_password_takes_pgpassword_or_the_password_file() {
    let cluster = rowsync_testkit::PgCluster::start_with_password(PASSWORD).unwrap();
    let url = cluster.url("postgres");
    let port = url.rsplit(':').next().unwrap().split('/').next().unwrap();
    let list = ["version", "list", "--db", url.as_str()];
    let refused = run(&list, &[]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("password"),
        "{}",
        stderr(&refused)
    );

    let from_variable = run(&list, &[("PGPASSWORD", PASSWORD)]);
    assert!(from_variable.status.success(), "{}", stderr(&from_variable));
    let wrong = run(&list, &[("PGPASSWORD", "not-it")]);
    assert!(!wrong.status.success());
    assert!(!stderr(&wrong).contains("not-it"), "{}", stderr(&wrong));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pgpass");
    let lines = format!(
        "# host:port:database:user:password\n\
         127.0.0.1:1:*:postgres:wrong-port\n\
         127.0.0.1:{port}:*:postgres:pg\\:pa\\\\ss-Word\n"
    );
    write_private(&file, &lines, 0o600);
    let named = file.to_str().unwrap();
    let from_file = run(&list, &[("PGPASSFILE", named)]);
    assert!(from_file.status.success(), "{}", stderr(&from_file));

    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open_to_all = run(&list, &[("PGPASSFILE", named)]);
    assert!(!open_to_all.status.success());
    let warning = format!(
        "warning: password file {named} has group or world access, so it is ignored, as \
         libpq ignores it; make it yours alone: chmod 0600 {named}\n"
    );
    assert!(
        stderr(&open_to_all).starts_with(&warning),
        "{}",
        stderr(&open_to_all)
    );

    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    write_private(&home.join(".pgpass"), &lines, 0o600);
    let from_home = run(&list, &[("HOME", home.to_str().unwrap())]);
    assert!(from_home.status.success(), "{}", stderr(&from_home));

    let password_file = dir.path().join("db-password");
    write_private(&password_file, &format!("{PASSWORD}\n"), 0o600);
    let mut with_file = list.to_vec();
    with_file.extend(["--db-password-file", password_file.to_str().unwrap()]);
    let from_option = run(&with_file, &[("PGPASSWORD", "not-it")]);
    assert!(from_option.status.success(), "{}", stderr(&from_option));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_url_without_a_password_takes_mysql_pwd() {
    use mysql_async::prelude::Queryable;
    let url = rowsync_testkit::fresh_mysql_database("mysql_pwd").await;
    let database = url.rsplit('/').next().unwrap().to_string();
    let mut admin = mysql_async::Conn::from_url(&url).await.unwrap();
    let user = format!("pw_{}", std::process::id());
    admin
        .query_drop(format!(
            "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'maria-Secret';
             GRANT ALL PRIVILEGES ON `{database}`.* TO '{user}'@'127.0.0.1'"
        ))
        .await
        .unwrap();
    let (scheme_and_user, host) = url.split_once('@').unwrap();
    let scheme = scheme_and_user.split("://").next().unwrap();
    let url = format!("{scheme}://{user}@{host}");
    let list = ["version", "list", "--db", url.as_str()];
    let refused = run(&list, &[]);
    assert!(!refused.status.success());
    let taken = run(&list, &[("MYSQL_PWD", "maria-Secret")]);
    assert!(taken.status.success(), "{}", stderr(&taken));
    let wrong = run(&list, &[("MYSQL_PWD", "not-it")]);
    assert!(!wrong.status.success());
    assert!(!stderr(&wrong).contains("not-it"), "{}", stderr(&wrong));
    // The option file, as the mysql client reads it, wins over the variable.
    let home = tempfile::tempdir().unwrap();
    let options = "[mysqld]\npassword = not-it\n[client]\npassword = \"maria-Secret\"\n";
    write_private(&home.path().join(".my.cnf"), options, 0o600);
    let home = home.path().to_str().unwrap();
    let from_file = run(&list, &[("HOME", home), ("MYSQL_PWD", "not-it")]);
    assert!(from_file.status.success(), "{}", stderr(&from_file));
}

#[test]
fn user_add_asks_twice_at_a_terminal_without_echo_and_reads_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("central.db");
    support::init_notes(&db);
    let db = db.to_str().unwrap();
    let said = at_a_terminal(
        &["user", "add", "--db", db, "--name", "erin"],
        &["typed-Secret", "typed-Secret"],
    );
    assert!(said.contains("password for erin: "), "{said}");
    assert!(said.contains("password for erin again: "), "{said}");
    assert!(said.contains("user erin saved"), "{said}");
    assert!(
        !said.contains("typed-Secret"),
        "the password was echoed: {said}"
    );
    let differ = at_a_terminal(
        &["user", "set-password", "--db", db, "--name", "erin"],
        &["one-Secret", "another"],
    );
    assert!(
        differ
            .contains("error: the two passwords differ; nothing was saved: run the command again"),
        "{differ}"
    );
    support::run_ok(
        &["user", "add", "--db", db, "--name", "frank"],
        "piped-Secret\n",
    );
    let users = support::run_ok(&["user", "list", "--db", db], "");
    assert!(users.contains("erin\tenabled") && users.contains("frank\tenabled"));
}

/// Runs `rowsync ARGS` on a new pseudo-terminal (its controlling terminal, as a login
/// shell's), typing each of `lines` after the next prompt; all it showed.
fn at_a_terminal(args: &[&str], lines: &[&str]) -> String {
    let (mut master, slave) = open_pty();
    let mut command = rowsync();
    command
        .args(args)
        .env_remove("ROWSYNC_PASSWORD")
        .stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid and ioctl are async-signal-safe; the child gets a session of its
    // own whose controlling terminal is the pty (fd 0), so /dev/tty is the pty.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().unwrap();
    // The program's ends of the terminal are its alone: its exit ends the master's reads.
    drop(command);
    let mut shown = String::new();
    for (typed, line) in lines.iter().enumerate() {
        read_until(&mut master, &mut shown, |text| {
            text.matches(": ").count() > typed && text.trim_end().ends_with(':')
        });
        master.write_all(format!("{line}\n").as_bytes()).unwrap();
    }
    read_until(&mut master, &mut shown, |_| false);
    child.wait().unwrap();
    shown
}

/// Reads what the terminal shows into `shown` until `done` says so (or 20 s pass).
fn read_until(master: &mut std::fs::File, shown: &mut String, done: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buffer = [0u8; 1024];
    while Instant::now() < deadline {
        let mut poll = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(master),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, 100) };
        if ready > 0 {
            match master.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(read) => shown.push_str(&String::from_utf8_lossy(&buffer[..read])),
            }
        } else if done(shown) {
            return;
        }
    }
}

/// A new pseudo-terminal: its master (to type and read) and its slave (the program's).
fn open_pty() -> (std::fs::File, OwnedFd) {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors, which are then owned here.
    unsafe {
        let opened = libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        );
        assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
        (
            std::fs::File::from(OwnedFd::from_raw_fd(master)),
            OwnedFd::from_raw_fd(slave),
        )
    }
}
