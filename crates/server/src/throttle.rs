//! Login throttling, counted in `login_failure_window`: after
//! `login_failures_per_address_max` refused logins from one address (an IPv6 address
//! counted by its /64), logins from it are refused; after
//! `login_failures_per_address_user_max` for one user name from one address, that
//! user's logins from that address are; and after `login_failures_per_user_max` for one
//! user name from anywhere, that user's logins are refused from every address that has
//! failed in the window. A user is never locked out from an address that has not
//! failed, so knowing a user name is not enough to lock its owner out. Refused logins
//! are refused without checking anything (no database, no argon2 work) until the window
//! that counted them ends. I/O-free: the caller gives the time.
//!
//! A farm throttles as one server: each server shares what it counted
//! (`own_changes`, stored in the consolidated database every
//! `farm_share_interval`) and adds what the others counted (`replace_others`),
//! so N servers do not allow N times the refused logins.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rowsync_consolidated::LoginFailures;

/// What is counted: an address (IPv6 by its /64), a user name at an address, or a user
/// name whatever the address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Address(IpAddr),
    AddressUser(IpAddr, String),
    User(String),
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    /// The first failure counted in the current window.
    since: Instant,
}

/// The limits (refused logins in the window) and the failures counted.
pub(crate) struct LoginThrottle {
    per_address_max: u32,
    per_address_user_max: u32,
    per_user_max: u32,
    window: Duration,
    failures: Mutex<Counted>,
}

/// This server's counts, the other servers' (summed by key), and the keys whose own
/// count changed since it was last shared.
#[derive(Default)]
struct Counted {
    own: HashMap<Key, Failures>,
    others: HashMap<Key, Failures>,
    changed: HashSet<Key>,
}

/// A key longer than this is counted here only (the database's column holds 512).
const SHARED_KEY_CHARS_MAX: usize = 500;

/// The limits of a [`LoginThrottle`], each a count of refused logins in the window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ThrottleLimits {
    pub(crate) per_address_max: u32,
    pub(crate) per_address_user_max: u32,
    pub(crate) per_user_max: u32,
}

/// Why a login is refused before it is checked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Throttled {
    /// "address", "user at this address" or "user".
    pub(crate) by: &'static str,
    pub(crate) retry_after: Duration,
}

impl LoginThrottle {
    pub(crate) fn new(limits: ThrottleLimits, window: Duration) -> LoginThrottle {
        LoginThrottle {
            per_address_max: limits.per_address_max,
            per_address_user_max: limits.per_address_user_max,
            per_user_max: limits.per_user_max,
            window,
            failures: Mutex::new(Counted::default()),
        }
    }

    /// Whether a login from `address` for `user` may be checked now.
    pub(crate) fn check(&self, address: IpAddr, user: &str, now: Instant) -> Result<(), Throttled> {
        let failures = self.lock();
        let address = counted_address(address);
        // The failures a key has in the current window (0 once the window ended), here
        // and on the other servers, and when the later of the two windows ends.
        let in_window = |map: &HashMap<Key, Failures>, key: &Key| {
            map.get(key)
                .filter(|counted| now < counted.since + self.window)
                .map_or((0, Duration::ZERO), |counted| {
                    (counted.count, counted.since + self.window - now)
                })
        };
        let counted = |key: &Key| {
            let (own, own_ends) = in_window(&failures.own, key);
            let (others, others_ends) = in_window(&failures.others, key);
            (own.saturating_add(others), own_ends.max(others_ends))
        };
        let (address_failures, address_ends) = counted(&Key::Address(address));
        let mut limits = vec![(
            address_failures,
            address_ends,
            self.per_address_max,
            "address",
        )];
        if !user.is_empty() {
            let (count, ends) = counted(&Key::AddressUser(address, user.to_string()));
            limits.push((
                count,
                ends,
                self.per_address_user_max,
                "user at this address",
            ));
            // The user's count from anywhere holds only where this address failed too.
            if address_failures > 0 {
                let (count, ends) = counted(&Key::User(user.to_string()));
                limits.push((count, ends.min(address_ends), self.per_user_max, "user"));
            }
        }
        match limits.into_iter().find(|(count, _, max, _)| count >= max) {
            Some((_, retry_after, _, by)) => Err(Throttled { by, retry_after }),
            None => Ok(()),
        }
    }

    /// Counts a refused login against its address, its user name at the address, and
    /// its user name.
    pub(crate) fn failed(&self, address: IpAddr, user: &str, now: Instant) {
        let mut failures = self.lock();
        let failures = &mut *failures;
        // Expired windows are dropped now and then, so the map holds only the keys
        // that failed within the last window.
        let own = &mut failures.own;
        if own.len() >= 1024 && own.len().is_power_of_two() {
            own.retain(|_, counted| now < counted.since + self.window);
        }
        for key in keys(counted_address(address), user) {
            failures.changed.insert(key.clone());
            let counted = own.entry(key).or_insert(Failures {
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

    /// A user logged in from an address: its counts there and its own start again (the
    /// address's does not, or one valid account would let an address guess other users'
    /// passwords unthrottled).
    pub(crate) fn succeeded(&self, address: IpAddr, user: &str) {
        let mut failures = self.lock();
        for key in [
            Key::AddressUser(counted_address(address), user.to_string()),
            Key::User(user.to_string()),
        ] {
            // Shared as 0, so the other servers stop counting what this one forgot.
            if failures.own.remove(&key).is_some() {
                failures.changed.insert(key);
            }
        }
    }

    /// This server's counts that changed since they were last taken, to share: each
    /// with when its window began (`now` is `now_unix_ms`); a count forgotten after a
    /// login is shared as 0.
    pub(crate) fn own_changes(&self, now: Instant, now_unix_ms: i64) -> Vec<LoginFailures> {
        let mut failures = self.lock();
        let changed = std::mem::take(&mut failures.changed);
        changed
            .into_iter()
            .filter_map(|key| {
                let text = key.text();
                if text.chars().count() > SHARED_KEY_CHARS_MAX {
                    return None;
                }
                let (count, since_unix_ms) = match failures.own.get(&key) {
                    Some(counted) => {
                        let age = now.saturating_duration_since(counted.since).as_millis();
                        (counted.count, now_unix_ms - age as i64)
                    }
                    None => (0, now_unix_ms),
                };
                Some(LoginFailures {
                    key: text,
                    failures: i64::from(count),
                    since_unix_ms,
                })
            })
            .collect()
    }

    /// `own_changes` that could not be shared: taken again next time.
    pub(crate) fn unshared(&self, changes: &[LoginFailures]) {
        let mut failures = self.lock();
        for change in changes {
            if let Some(key) = Key::parse(&change.key) {
                failures.changed.insert(key);
            }
        }
    }

    /// The other servers' counts, as the database holds them now (`rows`, each with
    /// when its window began), replacing those read before.
    pub(crate) fn replace_others(&self, rows: &[LoginFailures], now: Instant, now_unix_ms: i64) {
        let mut others: HashMap<Key, Failures> = HashMap::new();
        for row in rows {
            let Some(key) = Key::parse(&row.key) else {
                continue;
            };
            let age =
                Duration::from_millis(now_unix_ms.saturating_sub(row.since_unix_ms).max(0) as u64);
            if age >= self.window {
                continue;
            }
            let since = now.checked_sub(age).unwrap_or(now);
            let count = u32::try_from(row.failures).unwrap_or(u32::MAX);
            let summed = others.entry(key).or_insert(Failures { count: 0, since });
            summed.count = summed.count.saturating_add(count);
            summed.since = summed.since.min(since);
        }
        self.lock().others = others;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counted> {
        self.failures
            .lock()
            .expect("the throttle is never poisoned")
    }
}

impl Key {
    /// The key as the database keeps it: `a|address`, `au|address|user`, `u|user`.
    fn text(&self) -> String {
        match self {
            Key::Address(address) => format!("a|{address}"),
            Key::AddressUser(address, user) => format!("au|{address}|{user}"),
            Key::User(user) => format!("u|{user}"),
        }
    }

    fn parse(text: &str) -> Option<Key> {
        let (kind, rest) = text.split_once('|')?;
        match kind {
            "a" => Some(Key::Address(rest.parse().ok()?)),
            "au" => {
                let (address, user) = rest.split_once('|')?;
                Some(Key::AddressUser(address.parse().ok()?, user.to_string()))
            }
            "u" => Some(Key::User(rest.to_string())),
            _ => None,
        }
    }
}

/// The address a login is counted by: an IPv4 address itself (also when mapped into
/// IPv6), an IPv6 address by its /64 (one host commonly holds a whole /64).
fn counted_address(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(_) => address,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// The keys a login counts against: its address, and its user name there and anywhere
/// when it has one (a token login may leave it empty; those count by address only).
fn keys(address: IpAddr, user: &str) -> Vec<Key> {
    let mut keys = vec![Key::Address(address)];
    if !user.is_empty() {
        keys.push(Key::AddressUser(address, user.to_string()));
        keys.push(Key::User(user.to_string()));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(
        per_address_max: u32,
        per_address_user_max: u32,
        per_user_max: u32,
    ) -> LoginThrottle {
        let limits = ThrottleLimits {
            per_address_max,
            per_address_user_max,
            per_user_max,
        };
        LoginThrottle::new(limits, Duration::from_secs(60))
    }

    #[test]
    fn each_limit_refuses_until_its_window_ends() {
        let window = Duration::from_secs(60);
        let throttle = throttle(3, 2, 100);
        let start = Instant::now();
        let (first, second) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        throttle.failed(first, "alice", start);
        throttle.failed(first, "alice", start);
        // Two failures for alice from the first address: alice is throttled there only.
        let refused = throttle.check(first, "alice", start).unwrap_err();
        assert_eq!(refused.by, "user at this address");
        assert_eq!(refused.retry_after, window);
        assert!(throttle.check(second, "alice", start).is_ok());
        assert!(throttle.check(first, "bob", start).is_ok());
        throttle.failed(first, "bob", start);
        // Three failures from the first address: any user from it is throttled.
        assert_eq!(
            throttle.check(first, "dave", start).unwrap_err().by,
            "address"
        );
        assert!(throttle.check(second, "dave", start).is_ok());
        // The window ends.
        assert!(throttle.check(first, "dave", start + window).is_ok());
    }

    /// Issue 32, item 3: a user's count from anywhere refuses it only at addresses that
    /// failed; a login clears the user's counts, not the address's.
    #[test]
    fn a_user_is_never_locked_out_from_an_address_that_has_not_failed() {
        let throttle = throttle(30, 10, 3);
        let now = Instant::now();
        let guessers: Vec<IpAddr> = (1..=5)
            .map(|n| format!("10.0.1.{n}").parse().unwrap())
            .collect();
        for &guesser in &guessers {
            throttle.failed(guesser, "bob", now);
        }
        assert_eq!(
            throttle.check(guessers[0], "bob", now).unwrap_err().by,
            "user"
        );
        assert!(throttle.check(guessers[0], "alice", now).is_ok());
        let home: IpAddr = "10.0.2.1".parse().unwrap();
        assert!(throttle.check(home, "bob", now).is_ok());
        throttle.succeeded(home, "bob");
        assert!(throttle.check(guessers[0], "bob", now).is_ok());
    }

    /// An IPv6 host holds a whole /64: its addresses count as one.
    #[test]
    fn ipv6_addresses_count_by_their_64() {
        let throttle = throttle(2, 10, 100);
        let now = Instant::now();
        throttle.failed("2001:db8:1:2::1".parse().unwrap(), "a", now);
        throttle.failed("2001:db8:1:2:ffff::9".parse().unwrap(), "b", now);
        let same_64: IpAddr = "2001:db8:1:2::77".parse().unwrap();
        assert_eq!(throttle.check(same_64, "c", now).unwrap_err().by, "address");
        assert!(throttle
            .check("2001:db8:1:3::1".parse().unwrap(), "c", now)
            .is_ok());
        // An IPv4-mapped address is its IPv4 address.
        throttle.failed("10.9.9.9".parse().unwrap(), "a", now);
        throttle.failed("::ffff:10.9.9.9".parse().unwrap(), "a", now);
        assert!(throttle
            .check("10.9.9.9".parse().unwrap(), "c", now)
            .is_err());
    }

    /// What one server shares another adds to its own counts; a login that succeeds
    /// shares its forgotten counts as 0; counts from before the window do not hold.
    #[test]
    fn shared_counts_add_up_across_servers() {
        let (one, two) = (throttle(100, 2, 100), throttle(100, 2, 100));
        let now = Instant::now();
        let unix_ms = 1_000_000;
        let address: IpAddr = "10.0.0.1".parse().unwrap();
        one.failed(address, "bob", now);
        two.failed(address, "bob", now);
        assert!(two.check(address, "bob", now).is_ok());
        let shared = one.own_changes(now, unix_ms);
        assert_eq!(shared.len(), 3, "address, bob there, bob: {shared:?}");
        assert!(one.own_changes(now, unix_ms).is_empty(), "taken once");
        two.replace_others(&shared, now, unix_ms);
        assert_eq!(
            two.check(address, "bob", now).unwrap_err().by,
            "user at this address"
        );
        one.succeeded(address, "bob");
        let forgotten = one.own_changes(now, unix_ms);
        assert_eq!(forgotten.len(), 2);
        assert!(forgotten.iter().all(|counted| counted.failures == 0));
        two.replace_others(&forgotten, now, unix_ms);
        assert!(two.check(address, "bob", now).is_ok());
        // Counted an hour ago: outside the window of a minute.
        let old: Vec<LoginFailures> = shared
            .into_iter()
            .map(|counted| LoginFailures {
                since_unix_ms: unix_ms - 3_600_000,
                ..counted
            })
            .collect();
        two.replace_others(&old, now, unix_ms);
        assert!(two.check(address, "bob", now).is_ok());
    }
}
