//! Login throttling: after `login_failures_per_address_max` refused logins from one
//! address, or `login_failures_per_user_max` for one user name, within
//! `login_failure_window`, further logins from that address or for that user are
//! refused without checking anything (no database, no argon2 work) until the window
//! that counted them ends. I/O-free: the caller gives the time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What is counted: an address, or a user name (whatever address it comes from).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Address(IpAddr),
    User(String),
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    /// The first failure counted in the current window.
    since: Instant,
}

/// The limits and the failures counted.
pub(crate) struct LoginThrottle {
    per_address_max: u32,
    per_user_max: u32,
    window: Duration,
    failures: Mutex<HashMap<Key, Failures>>,
}

/// Why a login is refused before it is checked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Throttled {
    /// "address" or "user".
    pub(crate) by: &'static str,
    pub(crate) retry_after: Duration,
}

impl LoginThrottle {
    pub(crate) fn new(per_address_max: u32, per_user_max: u32, window: Duration) -> LoginThrottle {
        LoginThrottle {
            per_address_max,
            per_user_max,
            window,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a login from `address` for `user` may be checked now.
    pub(crate) fn check(&self, address: IpAddr, user: &str, now: Instant) -> Result<(), Throttled> {
        let failures = self
            .failures
            .lock()
            .expect("the throttle is never poisoned");
        for (key, max, by) in keys(address, user)
            .zip([self.per_address_max, self.per_user_max])
            .map(|(key, max)| {
                let by = if matches!(key, Key::Address(_)) {
                    "address"
                } else {
                    "user"
                };
                (key, max, by)
            })
        {
            if let Some(counted) = failures.get(&key) {
                let ends = counted.since + self.window;
                if counted.count >= max && now < ends {
                    return Err(Throttled {
                        by,
                        retry_after: ends - now,
                    });
                }
            }
        }
        Ok(())
    }

    /// Counts a refused login against its address and its user name.
    pub(crate) fn failed(&self, address: IpAddr, user: &str, now: Instant) {
        let mut failures = self
            .failures
            .lock()
            .expect("the throttle is never poisoned");
        // Expired windows are dropped now and then, so the map holds only the keys
        // that failed within the last window.
        if failures.len() >= 1024 && failures.len().is_power_of_two() {
            failures.retain(|_, counted| now < counted.since + self.window);
        }
        for key in keys(address, user) {
            let counted = failures.entry(key).or_insert(Failures {
                count: 0,
                since: now,
            });
            if now >= counted.since + self.window {
                *counted = Failures {
                    count: 0,
                    since: now,
                };
            }
            counted.count = counted.count.saturating_add(1);
        }
    }

    /// A user logged in: its own count starts again (its address's does not, or one
    /// valid account would let an address guess other users' passwords unthrottled).
    pub(crate) fn succeeded(&self, user: &str) {
        self.failures
            .lock()
            .expect("the throttle is never poisoned")
            .remove(&Key::User(user.to_string()));
    }
}

/// The keys a login counts against: its address, and its user name when it has one
/// (a token login may leave it empty; those are counted by address only).
fn keys(address: IpAddr, user: &str) -> impl Iterator<Item = Key> {
    std::iter::once(Key::Address(address))
        .chain((!user.is_empty()).then(|| Key::User(user.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_refuses_until_its_window_ends() {
        let window = Duration::from_secs(60);
        let throttle = LoginThrottle::new(3, 2, window);
        let start = Instant::now();
        let (first, second) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        throttle.failed(first, "alice", start);
        throttle.failed(second, "alice", start);
        // Two failures for alice, from two addresses: alice is throttled everywhere.
        let refused = throttle.check(second, "alice", start).unwrap_err();
        assert_eq!(refused.by, "user");
        assert_eq!(refused.retry_after, window);
        assert!(throttle.check(first, "bob", start).is_ok());
        throttle.failed(first, "bob", start);
        throttle.failed(first, "carol", start);
        // Three failures from the first address: any user from it is throttled.
        assert_eq!(
            throttle.check(first, "dave", start).unwrap_err().by,
            "address"
        );
        assert!(throttle.check(second, "dave", start).is_ok());
        // A login of alice resets alice's count, not the address's.
        throttle.succeeded("alice");
        assert!(throttle.check(second, "alice", start).is_ok());
        // The window ends.
        assert!(throttle.check(first, "dave", start + window).is_ok());
    }
}
