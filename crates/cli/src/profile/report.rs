//! What `rowsync profile` found, as JSON (`--json`, `--out` for the monitor) and as the
//! table it prints.

use serde::{Deserialize, Serialize};

/// One profile run of a script version.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileReport {
    pub created_unix_ms: u64,
    pub database: String,
    pub script_version: String,
    /// The cores perfect scaling is reckoned for.
    pub cores: usize,
    pub copies: Vec<usize>,
    /// Where the parameters came from (a recording, subscriptions, partition values).
    pub parameter_source: String,
    /// Users the copies ran as (identical copies all run as the first).
    pub users: Vec<String>,
    pub targets: Vec<TargetReport>,
    /// The plan advisor's findings (`--plans`), `None` when it did not run.
    pub plans: Option<Vec<PlanReport>>,
}

/// One script, or one whole sync type, measured alone and as N copies at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetReport {
    /// `end_synchronization`, `notes download_cursor`, `sync upload_update`, ...
    pub name: String,
    /// `script` (run in a transaction rolled back) or `sync` (whole syncs, committed).
    pub kind: String,
    /// Median time of one copy alone, in milliseconds.
    pub alone_ms: Option<f64>,
    pub runs: Vec<RunReport>,
    /// What the copies' sessions were doing when sampled, over every run.
    pub waits: Vec<WaitCount>,
    /// Rows several copies fought over.
    pub hot_rows: Vec<HotRow>,
    pub verdict: Verdict,
}

/// N copies at once, with identical or distinct parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunReport {
    pub copies: usize,
    /// `identical` (every copy the same user: the paper's worst case) or `distinct`.
    pub parameters: String,
    /// Median over the rounds of the time from the start of all copies to the end of the
    /// last, in milliseconds.
    pub wall_ms: f64,
    /// That time over perfect scaling: the time alone times ceil(copies / cores). 1 is
    /// perfect; `copies / ceil(copies / cores)` is no better than one after another.
    pub ratio: Option<f64>,
    /// Copies that failed, with the first error.
    pub errors: u64,
    pub first_error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WaitCount {
    /// `CPU` (active, waiting on nothing), or `type:event` as pg_stat_activity names it.
    pub wait: String,
    pub samples: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HotRow {
    /// The relation as PostgreSQL names it (`regclass`).
    pub relation: String,
    /// The row's primary key (`id=1`), or `sampler::UNREAD_KEY` when the row's version
    /// was gone by the time the sampler read it.
    pub key: String,
    /// Times a waiting copy was seen waiting for it.
    pub waits: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    /// Nothing waited on a lock, a lightweight lock or a buffer most of the time.
    Clean,
    /// Copies waited for a row another copy had written.
    HotRow,
    /// Copies waited on heavyweight locks other than rows (a table, an advisory lock).
    LockWait,
    /// Most samples of the running copies waited on a lightweight lock or a buffer pin.
    Convoy,
    /// The script failed.
    Error,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub finding: String,
    /// The paper's remedy for it.
    pub remedy: String,
}

/// One script's plan, with what the advisor makes of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanReport {
    pub table: String,
    pub event: String,
    /// The plan's nodes, one line each, indented (PostgreSQL: with actual rows and time).
    pub plan: Vec<String>,
    pub findings: Vec<PlanFinding>,
    /// The script could not be explained (a script error), with the database's message.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PlanFinding {
    /// `full_scan`, `missing_tracking_index` or `estimate_off`.
    pub kind: String,
    pub detail: String,
    /// The `CREATE INDEX` that would serve it, when one would.
    pub proposal: Option<String>,
}

/// The report as the table `rowsync profile` prints.
pub fn render(report: &ProfileReport) -> String {
    let mut out = format!(
        "profile of script version {} on {} ({} cores; parameters: {}; users: {})\n",
        report.script_version,
        report.database,
        report.cores,
        report.parameter_source,
        report.users.join(", ")
    );
    out.push_str(&format!(
        "{:<34} {:>3} {:>12} {:>7} {:>12} {:>7}  waited on (samples)\n",
        "script or sync type", "N", "identical ms", "ratio", "distinct ms", "ratio"
    ));
    for target in &report.targets {
        render_target(&mut out, target);
    }
    if let Some(plans) = &report.plans {
        out.push_str(&render_plans(plans));
    }
    out
}

fn render_target(out: &mut String, target: &TargetReport) {
    let mut copies: Vec<usize> = target.runs.iter().map(|run| run.copies).collect();
    copies.dedup();
    for (index, &n) in copies.iter().enumerate() {
        let run = |parameters: &str| {
            target
                .runs
                .iter()
                .find(|run| run.copies == n && run.parameters == parameters)
        };
        let cell = |run: Option<&RunReport>| match run {
            Some(run) if run.errors > 0 => ("failed".to_string(), String::new()),
            Some(run) => (
                format!("{:.2}", run.wall_ms),
                run.ratio
                    .map_or(String::new(), |ratio| format!("{ratio:.2}")),
            ),
            None => ("-".to_string(), String::new()),
        };
        let (same, same_ratio) = cell(run("identical"));
        let (distinct, distinct_ratio) = cell(run("distinct"));
        let name = if index == 0 { target.name.as_str() } else { "" };
        let waits = if index == 0 {
            waits_text(&target.waits)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{name:<34} {n:>3} {same:>12} {same_ratio:>7} {distinct:>12} {distinct_ratio:>7}  {waits}\n"
        ));
    }
    for row in &target.hot_rows {
        out.push_str(&format!(
            "    hot row: {} ({}), waited for {} times\n",
            row.relation, row.key, row.waits
        ));
    }
    out.push_str(&format!(
        "    verdict: {}{}\n",
        target.verdict.finding,
        if target.verdict.remedy.is_empty() {
            String::new()
        } else {
            format!("; remedy: {}", target.verdict.remedy)
        }
    ));
}

fn waits_text(waits: &[WaitCount]) -> String {
    waits
        .iter()
        .map(|wait| format!("{} {}", wait.wait, wait.samples))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The plan advisor's part of the table.
pub fn render_plans(plans: &[PlanReport]) -> String {
    let mut out = String::from("\nplans\n");
    for plan in plans {
        let table = if plan.table.is_empty() {
            "(connection)"
        } else {
            plan.table.as_str()
        };
        let status = match (&plan.error, plan.findings.is_empty()) {
            (Some(error), _) => format!("not explained: {error}"),
            (None, true) => "clean".to_string(),
            (None, false) => format!("{} finding(s)", plan.findings.len()),
        };
        out.push_str(&format!("{table} {}: {status}\n", plan.event));
        for line in &plan.plan {
            out.push_str(&format!("    {line}\n"));
        }
        for finding in &plan.findings {
            out.push_str(&format!("  ! {}: {}\n", finding.kind, finding.detail));
            if let Some(proposal) = &finding.proposal {
                out.push_str(&format!("    proposed: {proposal}\n"));
            }
        }
    }
    out
}
