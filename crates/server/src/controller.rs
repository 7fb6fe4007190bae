//! The worker-count controller: measurements in, decisions out, no I/O (the server
//! feeds it one [`Sample`] per `adjust_interval` and applies what it decides).
//!
//! It hill-climbs on throughput. While syncs wait for a worker it moves the count one
//! way and keeps going while throughput rises; when throughput falls after a move, the
//! database is contending (locks, I/O, CPU), so it turns back with a smaller step.
//! A flat response means more workers buy nothing, so it steps down: the fewest workers
//! that give the same throughput are best. Without a queue it only sheds idle workers.
//! MobiLink adjusted every 30 s and could not follow bursts; a few seconds per step
//! finds the best count within seconds.

use std::time::Duration;

/// Throughput changes smaller than this fraction are noise.
pub const THROUGHPUT_TOLERANCE: f64 = 0.05;
/// Largest single move, in workers.
pub const WORKER_STEP_MAX: usize = 16;
/// Weight of one sync against uploaded and downloaded rows in the throughput measure,
/// so that empty syncs count too.
pub const ROWS_PER_SYNC_EQUIVALENT: f64 = 10.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerConfig {
    pub workers_min: usize,
    pub workers_max: usize,
    pub adjust_interval: Duration,
}

/// What the server measured over one interval.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub interval: Duration,
    pub syncs_completed: u64,
    /// Rows uploaded plus rows downloaded by those syncs.
    pub rows: u64,
    /// Syncs that had to wait for a worker during the interval.
    pub syncs_waited: u64,
    /// Total time syncs held a worker (database time), summed over workers.
    pub worker_busy: Duration,
}

impl Sample {
    pub fn throughput(&self) -> f64 {
        let seconds = self.interval.as_secs_f64().max(1e-9);
        (self.rows as f64 + ROWS_PER_SYNC_EQUIVALENT * self.syncs_completed as f64) / seconds
    }

    /// Fraction of the interval the workers were busy (0 to 1).
    pub fn utilization(&self, workers: usize) -> f64 {
        let capacity = self.interval.as_secs_f64() * workers.max(1) as f64;
        (self.worker_busy.as_secs_f64() / capacity.max(1e-9)).min(1.0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub workers: usize,
    pub reason: String,
}

#[derive(Debug)]
pub struct WorkerController {
    config: ControllerConfig,
    workers: usize,
    /// +1 growing, -1 shrinking.
    direction: i64,
    step: usize,
    /// Doubling steps until the first move that does not help; then fine steps only.
    exploring: bool,
    /// Throughput measured at the previous count, if the count moved since.
    previous: Option<(usize, f64)>,
    /// The farm's share for this server (`farm_workers_max`), below `workers_max`.
    ceiling: Option<usize>,
}

impl WorkerController {
    /// Starts at the minimum, as MobiLink did; demand moves it up within seconds.
    pub fn new(config: ControllerConfig) -> WorkerController {
        assert!(
            config.workers_min >= 1 && config.workers_min <= config.workers_max,
            "workers_min must be at least 1 and at most workers_max"
        );
        WorkerController {
            config,
            workers: config.workers_min,
            direction: 1,
            step: 1,
            exploring: true,
            previous: None,
            ceiling: None,
        }
    }

    /// The most workers this server may run as one of a farm (its share of
    /// `farm_workers_max`; `None`: `workers_max`). A count above it moves down at once.
    pub fn set_ceiling(&mut self, ceiling: Option<usize>) -> Option<Decision> {
        self.ceiling = ceiling;
        let top = self.top();
        if self.workers <= top {
            return None;
        }
        self.previous = None;
        self.move_to(
            top,
            format!("the farm's share of workers for this server is {top}"),
        )
    }

    /// The most workers now: `workers_max`, or the farm's share within the range.
    fn top(&self) -> usize {
        let (min, max) = (self.config.workers_min, self.config.workers_max);
        self.ceiling.map_or(max, |ceiling| ceiling.clamp(min, max))
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    pub fn config(&self) -> ControllerConfig {
        self.config
    }

    /// Takes one interval's measurements; returns a decision when the count changes.
    pub fn observe(&mut self, sample: Sample) -> Option<Decision> {
        let throughput = sample.throughput();
        let current = self.workers;
        if sample.syncs_waited == 0 {
            // Nobody waited: more workers cannot help. Shed one if they idle.
            self.previous = None;
            self.direction = 1;
            self.step = 1;
            self.exploring = true;
            if current > self.config.workers_min && sample.utilization(current) < 0.5 {
                return self.move_to(
                    current - 1,
                    format!(
                        "no sync waited for a worker and workers were {:.0}% busy",
                        100.0 * sample.utilization(current)
                    ),
                );
            }
            return None;
        }
        let reason;
        match self.previous {
            None => {
                reason = format!(
                    "{} syncs waited for a worker at {throughput:.0} rows/s: trying more workers",
                    sample.syncs_waited
                );
                self.direction = 1;
            }
            Some((before, previous)) if throughput > previous * (1.0 + THROUGHPUT_TOLERANCE) => {
                if self.exploring {
                    self.step = (self.step * 2).min(WORKER_STEP_MAX);
                }
                reason = format!(
                    "throughput rose from {previous:.0} to {throughput:.0} rows/s when going from {before} to {current} workers: continuing"
                );
            }
            Some((before, previous)) if throughput < previous * (1.0 - THROUGHPUT_TOLERANCE) => {
                self.direction = -self.direction;
                self.step = (self.step / 2).max(1);
                self.exploring = false;
                reason = format!(
                    "throughput fell from {previous:.0} to {throughput:.0} rows/s when going from {before} to {current} workers: contention, turning back"
                );
            }
            Some((before, previous)) => {
                // Flat: the same work with fewer workers is better.
                self.direction = -1;
                self.step = 1;
                self.exploring = false;
                reason = format!(
                    "throughput flat ({previous:.0} to {throughput:.0} rows/s) from {before} to {current} workers: fewer workers suffice"
                );
            }
        }
        let target = if self.direction > 0 {
            current.saturating_add(self.step)
        } else {
            current.saturating_sub(self.step)
        }
        .clamp(self.config.workers_min, self.top());
        if target == current {
            // At a bound: measure here again, coming back from the other side next.
            self.previous = Some((current, throughput));
            self.direction = -self.direction;
            self.step = 1;
            return None;
        }
        self.previous = Some((current, throughput));
        self.move_to(target, reason)
    }

    fn move_to(&mut self, workers: usize, reason: String) -> Option<Decision> {
        self.workers = workers;
        Some(Decision { workers, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn config(min: usize, max: usize) -> ControllerConfig {
        ControllerConfig {
            workers_min: min,
            workers_max: max,
            adjust_interval: Duration::from_secs(2),
        }
    }

    /// Runs the controller against a synthetic database whose throughput at `n` workers
    /// is `capacity(n)` rows/s (with ±3% noise), always with syncs waiting; returns the
    /// counts it chose, interval by interval.
    fn simulate(
        controller: &mut WorkerController,
        capacity: impl Fn(usize) -> f64,
        intervals: usize,
        seed: u64,
    ) -> Vec<usize> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut counts = Vec::new();
        for _ in 0..intervals {
            let n = controller.workers();
            let rows = capacity(n) * 2.0 * rng.gen_range(0.97..1.03);
            controller.observe(Sample {
                interval: Duration::from_secs(2),
                syncs_completed: 0,
                rows: rows as u64,
                syncs_waited: 50,
                worker_busy: Duration::from_secs(2 * n as u64),
            });
            counts.push(controller.workers());
        }
        counts
    }

    /// A farm's share caps the count: above it the count moves down at once, and the
    /// search for the peak stays below it.
    #[test]
    fn a_farm_share_caps_the_count() {
        let capacity = |n: usize| 5_000.0 * n as f64;
        let mut controller = WorkerController::new(config(1, 100));
        let grown = simulate(&mut controller, capacity, 20, 1);
        assert!(*grown.last().unwrap() > 8, "{grown:?}");
        let decision = controller.set_ceiling(Some(8)).expect("moves down");
        assert_eq!(decision.workers, 8);
        let capped = simulate(&mut controller, capacity, 20, 2);
        assert!(capped.iter().all(|&n| n <= 8), "{capped:?}");
        assert!(
            controller.set_ceiling(Some(0)).is_some(),
            "never below the minimum"
        );
        assert_eq!(controller.workers(), 1);
    }

    #[test]
    fn finds_the_peak_of_a_load_whose_best_count_is_known() {
        // Throughput grows with workers until 12, then contention takes it down.
        let capacity = |n: usize| {
            if n <= 12 {
                5_000.0 * n as f64
            } else {
                60_000.0 - 5_000.0 * (n - 12) as f64
            }
        };
        for seed in 0..20 {
            let mut controller = WorkerController::new(config(1, 100));
            let counts = simulate(&mut controller, capacity, 40, seed);
            let settled = &counts[20..];
            assert!(
                settled.iter().all(|&n| (9..=15).contains(&n)),
                "seed {seed}: {counts:?}"
            );
            let average = settled.iter().sum::<usize>() as f64 / settled.len() as f64;
            assert!((10.5..=13.5).contains(&average), "seed {seed}: {counts:?}");
            // Within seconds: near the peak by the tenth interval.
            assert!(
                counts[..10].iter().any(|&n| (8..=16).contains(&n)),
                "seed {seed}: {counts:?}"
            );
        }
    }

    #[test]
    fn backs_off_when_more_workers_only_add_contention() {
        // Beyond 4 workers every added one costs throughput (a hot lock).
        let capacity = |n: usize| {
            if n <= 4 {
                1000.0 * n as f64
            } else {
                4000.0 - 600.0 * (n - 4) as f64
            }
        };
        let mut controller = WorkerController::new(config(2, 64));
        let counts = simulate(&mut controller, capacity, 30, 7);
        assert!(counts[10..].iter().all(|&n| n <= 7), "{counts:?}");
    }

    #[test]
    fn stays_within_its_range_and_sheds_idle_workers() {
        let mut controller = WorkerController::new(config(3, 5));
        let counts = simulate(&mut controller, |n| 1000.0 * n as f64, 20, 1);
        assert!(counts.iter().all(|&n| (3..=5).contains(&n)), "{counts:?}");
        assert!(counts.contains(&5), "{counts:?}");
        // No queue, idle workers: down to the minimum, one at a time.
        let mut decisions = Vec::new();
        for _ in 0..5 {
            if let Some(decision) = controller.observe(Sample {
                interval: Duration::from_secs(2),
                syncs_completed: 3,
                rows: 30,
                syncs_waited: 0,
                worker_busy: Duration::from_millis(100),
            }) {
                decisions.push(decision);
            }
        }
        assert_eq!(controller.workers(), 3);
        assert!(
            decisions
                .iter()
                .all(|d| d.reason.contains("no sync waited")),
            "{decisions:?}"
        );
    }
}
