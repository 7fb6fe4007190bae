//! Tables, plots and JSON of a bench run.
//!
//! The text tables are laid out like the white paper's (first column the varied
//! parameter, then Download, Update, Delete, Insert), each test followed by the paper's
//! own published tables for that test under [`PUBLISHED_LABEL`]. The plots are SVG, one
//! per test, like the paper's figures: total server time against the varied parameter,
//! one line per sync type, the database's limit dashed in the same color.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use thiserror::Error;

use super::paper::{self, PaperTable, Unit, PUBLISHED_LABEL};
use super::results::{BenchRun, CpuUsage, Point, TestResult, SYNC_TYPES};

/// Column headers of the four sync types, in [`SYNC_TYPES`] order.
const TYPE_HEADERS: [&str; 4] = ["Download", "Update", "Delete", "Insert"];
/// Bytes per row the paper's schema put on the wire.
const PAPER_WIRE_BYTES_PER_ROW: f64 = 92.0;
/// Narrowest first column; a longer label widens its table.
const FIRST_COLUMN_WIDTH_MIN: usize = 18;
/// Narrowest number column; a longer cell widens its column.
const NUMBER_COLUMN_WIDTH_MIN: usize = 10;
const PLOT_SIZE_PIXELS: (u32, u32) = (900, 600);
/// Width of the legend column right of the chart.
const LEGEND_WIDTH_PIXELS: u32 = 170;
/// Font size of tick labels (plotters renders sizes divided by 1.24).
const TICK_FONT_SIZE: u32 = 15;
/// A linear axis whose closest two values are nearer than this fraction of its span
/// would crowd them: the points are spaced evenly instead.
const LINEAR_AXIS_GAP_MIN: f64 = 0.03;
/// A numeric axis turns logarithmic when its values are positive and span this factor.
const LOG_AXIS_SPAN_MIN: f64 = 20.0;
const BYTES_PER_MEBIBYTE: f64 = 1024.0 * 1024.0;

/// Line colors per sync type, in [`SYNC_TYPES`] order (distinct in color and in print).
const TYPE_COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
];

/// Why a report could not be written; every variant names the path that failed.
#[derive(Debug, Error)]
pub enum ReportError {
    #[error("cannot create the results directory {path}: {source}")]
    CreateDirectory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode the results as JSON for {path}: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot draw the plot {path}: {message}")]
    Plot { path: PathBuf, message: String },
}

// ---------------------------------------------------------------------------------------
// Text

/// One test as plain-text tables: rowsync's times, the limit, the efficiency, RSD,
/// retries, throughput per point, the row-script reference, notes, then the paper's
/// published tables for this test.
pub fn render_test(test: &TestResult) -> String {
    let mut out = String::new();
    let heading = format!("Test {}: {}", test.test, test.title);
    let _ = writeln!(out, "{heading}\n{}", "=".repeat(heading.chars().count()));
    render_configuration(&mut out, test);

    if test.points.is_empty() {
        out.push_str("\nNo points were measured.\n");
    } else {
        render_times(&mut out, test);
        render_limit(&mut out, test);
        render_efficiency(&mut out, test);
        render_cpu_efficiency(&mut out, test);
        render_rsd(&mut out, test);
        render_retries(&mut out, test);
        render_throughput(&mut out, test);
    }
    render_row_scripts(&mut out, test);

    if !test.notes.is_empty() {
        out.push_str("\nNotes\n");
        for note in &test.notes {
            let _ = writeln!(out, "- {note}");
        }
    }

    let published = paper::published_for(test.test);
    if !published.is_empty() {
        out.push_str("\nThe paper's figures for this test\n");
        for table in published {
            render_paper_table(&mut out, table);
        }
    }
    out
}

/// The whole run: a header, every test, then the efficiency summary.
pub fn render_run(run: &BenchRun) -> String {
    let mut out = String::new();
    let heading = "rowsync bench";
    let _ = writeln!(out, "{heading}\n{}", "=".repeat(heading.len()));
    let _ = writeln!(out, "size:                {}", or_dash(&run.size));
    let _ = writeln!(out, "client mode:         {}", or_dash(&run.client_mode));
    let _ = writeln!(
        out,
        "wire bytes per row:  {:.1} (the paper: {PAPER_WIRE_BYTES_PER_ROW:.0})",
        run.wire_bytes_per_row
    );
    let _ = writeln!(out, "started:             {}", or_dash(&run.started));
    let _ = writeln!(out, "machine:             {}", or_dash(&run.machine));

    for test in &run.tests {
        out.push('\n');
        out.push_str(&render_test(test));
    }

    out.push('\n');
    render_efficiency_summary(&mut out, run);
    out
}

/// One configuration field of a point, as printed.
type PointField = fn(&Point) -> String;

fn render_configuration(out: &mut String, test: &TestResult) {
    let Some(first) = test.points.first() else {
        return;
    };
    let fields: [(&str, PointField); 7] = [
        ("clients", |p| p.clients.to_string()),
        ("rows per sync", |p| p.rows_per_sync.to_string()),
        ("sets", |p| p.sets.to_string()),
        ("workers", |p| or_dash(&p.workers)),
        ("connections max", |p| p.connections_max.to_string()),
        ("retry", |p| or_dash(&p.retry)),
        ("transport", |p| or_dash(&p.transport)),
    ];
    let mut constant = Vec::new();
    let mut varying = Vec::new();
    for (name, value) in fields {
        if test.points.iter().all(|p| value(p) == value(first)) {
            constant.push(format!("{name} {}", value(first)));
        } else {
            varying.push((name, value));
        }
    }
    let runs: Vec<usize> = test.points.iter().map(|p| p.runs.len()).collect();
    let runs_text = match (runs.iter().min(), runs.iter().max()) {
        (Some(low), Some(high)) if low == high => format!("{low}"),
        (Some(low), Some(high)) => format!("{low} to {high}"),
        _ => "0".to_string(),
    };
    let _ = writeln!(
        out,
        "\n{} points, {runs_text} run(s) each; kept constant: {}",
        test.points.len(),
        if constant.is_empty() {
            "nothing".to_string()
        } else {
            constant.join(", ")
        }
    );
    if !varying.is_empty() {
        let headers: Vec<&str> = varying.iter().map(|(name, _)| *name).collect();
        let rows = test
            .points
            .iter()
            .map(|p| {
                let cells = varying.iter().map(|(_, value)| value(p)).collect();
                (p.label.clone(), cells)
            })
            .collect::<Vec<_>>();
        render_table(
            out,
            "Configuration per point",
            &test.parameter,
            &headers,
            &rows,
        );
    }
}

fn render_times(out: &mut String, test: &TestResult) {
    let rows = test
        .points
        .iter()
        .map(|p| {
            let best = p.best_seconds();
            (p.label.clone(), with_sum(best, format_seconds))
        })
        .collect::<Vec<_>>();
    render_table(
        out,
        "Total server time (s), best of the runs",
        &test.parameter,
        &headers_with_sum(),
        &rows,
    );
}

fn render_limit(out: &mut String, test: &TestResult) {
    let rows = test
        .points
        .iter()
        .filter_map(|p| {
            let limit = p.limit_seconds?;
            let values = limit.map(|seconds| Some(seconds).filter(|s| limit_is_measured(*s)));
            Some((p.label.clone(), with_sum(values, format_seconds)))
        })
        .collect::<Vec<_>>();
    if !rows.is_empty() {
        render_table(
            out,
            "Limit (PostgreSQL bulk path, same run): total server time (s)",
            &test.parameter,
            &headers_with_sum(),
            &rows,
        );
    }
}

fn render_efficiency(out: &mut String, test: &TestResult) {
    let rows = test
        .points
        .iter()
        .filter(|p| p.limit_seconds.is_some())
        .map(|p| {
            let cells = efficiency(p).iter().map(|e| format_ratio(*e)).collect();
            (p.label.clone(), cells)
        })
        .collect::<Vec<_>>();
    if !rows.is_empty() {
        render_table(
            out,
            "Efficiency = limit / rowsync (1.00 = at the database's bulk limit)",
            &test.parameter,
            &TYPE_HEADERS,
            &rows,
        );
    }
}

fn render_cpu_efficiency(out: &mut String, test: &TestResult) {
    let rows = test
        .points
        .iter()
        .map(|p| (p, p.cpu_efficiency()))
        .filter(|(_, e)| e.iter().any(Option::is_some))
        .map(|(p, e)| {
            (
                p.label.clone(),
                e.iter().map(|e| format_ratio(*e)).collect(),
            )
        })
        .collect::<Vec<_>>();
    if !rows.is_empty() {
        render_table(
            out,
            CPU_EFFICIENCY_TITLE,
            &test.parameter,
            &TYPE_HEADERS,
            &rows,
        );
    }
}

/// The fair second reference's table title.
const CPU_EFFICIENCY_TITLE: &str = "CPU efficiency = limit CPU (PostgreSQL + its driver) / rowsync CPU (server + PostgreSQL), the clients' CPU left out";

fn render_rsd(out: &mut String, test: &TestResult) {
    let rows = test
        .points
        .iter()
        .filter(|p| p.runs.len() >= 2)
        .map(|p| {
            let cells = p.rsd_percent().iter().map(|r| format_percent(*r)).collect();
            (format!("{} ({} runs)", p.label, p.runs.len()), cells)
        })
        .collect::<Vec<_>>();
    if !rows.is_empty() {
        render_table(
            out,
            "Relative standard deviation of the total server time over the runs",
            &test.parameter,
            &TYPE_HEADERS,
            &rows,
        );
    }
}

fn render_retries(out: &mut String, test: &TestResult) {
    let rows = test
        .points
        .iter()
        .filter(|p| p.busy_retries().iter().flatten().any(|r| *r > 0))
        .map(|p| {
            let cells = p
                .busy_retries()
                .iter()
                .map(|r| r.map_or_else(|| "-".to_string(), |r| r.to_string()))
                .collect();
            (p.label.clone(), cells)
        })
        .collect::<Vec<_>>();
    if !rows.is_empty() {
        render_table(
            out,
            "Busy answers the clients retried (best run)",
            &test.parameter,
            &TYPE_HEADERS,
            &rows,
        );
    }
}

fn render_throughput(out: &mut String, test: &TestResult) {
    out.push_str("\nPer point, best run of each sync type (CPU: seconds over the timed sets, gate to gate; cores busy: the whole machine's busy time over that wall time)\n");
    let headers = [
        "syncs/s",
        "rows/s",
        "MB/s",
        "client median s",
        "client p99 s",
        "server CPU s",
        "PG CPU s",
        "client CPU s",
        "cores busy",
    ];
    for point in &test.points {
        let _ = writeln!(
            out,
            "\n{} = {}: server peak RSS {:.1} MiB",
            test.parameter,
            point.label,
            point.server_peak_rss_bytes as f64 / BYTES_PER_MEBIBYTE
        );
        let rows = SYNC_TYPES
            .iter()
            .filter_map(|sync_type| {
                let phase = point.best_phase(sync_type)?;
                let mut cells = vec![
                    format!("{:.1}", phase.syncs_per_second()),
                    format!("{:.0}", phase.rows_per_second()),
                    format!("{:.2}", phase.megabytes_per_second()),
                    format!("{:.3}", phase.client_seconds_median),
                    format!("{:.3}", phase.client_seconds_p99),
                    format!("{:.3}", phase.server_cpu_seconds),
                ];
                cells.extend(cpu_cells(phase.cpu.as_ref()));
                Some((format!("  {sync_type}"), cells))
            })
            .collect::<Vec<_>>();
        if rows.is_empty() {
            out.push_str("  no sync type measured\n");
        } else {
            write_table_body(out, "  sync type", &headers, &rows);
        }
        render_limit_cpu(out, point);
    }
}

/// PostgreSQL's CPU, the bench process's (the clients, or the limit's driver) and the
/// cores busy, as printed ("-" where not measured).
fn cpu_cells(cpu: Option<&CpuUsage>) -> Vec<String> {
    let Some(cpu) = cpu else {
        return vec!["-".to_string(); 3];
    };
    vec![
        format_seconds(cpu.database_seconds),
        format!("{:.3}", cpu.bench_seconds),
        format!(
            "{:.2}",
            cpu.machine_busy_seconds / cpu.wall_seconds.max(f64::MIN_POSITIVE)
        ),
    ]
}

fn render_limit_cpu(out: &mut String, point: &Point) {
    let Some(limit) = &point.limit_cpu else {
        return;
    };
    let rows = SYNC_TYPES
        .iter()
        .zip(limit)
        .map(|(sync_type, cpu)| (format!("  {sync_type}"), cpu_cells(Some(cpu))))
        .collect::<Vec<_>>();
    write_table_body(
        out,
        "  limit",
        &["PG CPU s", "driver CPU s", "cores busy"],
        &rows,
    );
}

fn render_row_scripts(out: &mut String, test: &TestResult) {
    let Some(row_point) = &test.row_scripts else {
        return;
    };
    let row_best = row_point.best_seconds();
    let base = test.points.first();
    let set_best = base.map_or([None; 4], Point::best_seconds);
    let ratio: [Option<f64>; 4] = std::array::from_fn(|i| match (row_best[i], set_best[i]) {
        (Some(row), Some(set)) if set > 0.0 => Some(row / set),
        _ => None,
    });
    let title = match base {
        Some(base) => format!(
            "Row scripts (one statement per row) vs set scripts at {} = {}: total server time (s)",
            test.parameter, base.label
        ),
        None => "Row scripts (one statement per row): total server time (s)".to_string(),
    };
    let rows = vec![
        (
            "row scripts".to_string(),
            row_best.iter().map(|s| format_seconds(*s)).collect(),
        ),
        (
            "set scripts".to_string(),
            set_best.iter().map(|s| format_seconds(*s)).collect(),
        ),
        (
            "row / set".to_string(),
            ratio.iter().map(|r| format_ratio(*r)).collect(),
        ),
    ];
    render_table(out, &title, "scripts", &TYPE_HEADERS, &rows);
    for (sync_type, ratio) in SYNC_TYPES.iter().zip(ratio) {
        let Some(ratio) = ratio.filter(|r| r.is_finite() && *r > 0.0) else {
            continue;
        };
        if ratio >= 1.0 {
            let _ = writeln!(out, "{sync_type}: set scripts are {ratio:.1}x faster");
        } else {
            let _ = writeln!(
                out,
                "{sync_type}: set scripts are {:.1}x slower",
                1.0 / ratio
            );
        }
    }
}

fn render_paper_table(out: &mut String, table: &PaperTable) {
    let has_sum = table.rows.iter().any(|row| row.sum.is_some());
    let format = |value: f64| match table.unit {
        Unit::Seconds => format!("{value:.1}"),
        Unit::Percent => format!("{value:.1}%"),
        Unit::Retries => format!("{value:.0}"),
    };
    let rows = table
        .rows
        .iter()
        .map(|row| {
            let mut cells: Vec<String> = row.values.iter().map(|v| format(*v)).collect();
            if has_sum {
                cells.push(row.sum.map_or_else(|| "-".to_string(), format));
            }
            (row.label.to_string(), cells)
        })
        .collect::<Vec<_>>();
    let headers = if has_sum {
        headers_with_sum()
    } else {
        TYPE_HEADERS.to_vec()
    };
    let title = format!(
        "Table {}: {}\n{PUBLISHED_LABEL}",
        table.number, table.caption
    );
    render_table(out, &title, table.parameter, &headers, &rows);
}

fn render_efficiency_summary(out: &mut String, run: &BenchRun) {
    let title = "Efficiency per sync type (limit / rowsync; 1.00 = at the database's bulk limit)";
    let _ = writeln!(out, "{title}\n{}", "=".repeat(title.len()));
    let mut rows = Vec::new();
    for test in &run.tests {
        let efficiencies: Vec<[Option<f64>; 4]> = test.points.iter().map(efficiency).collect();
        if efficiencies.iter().flatten().all(Option::is_none) {
            rows.push((format!("Test {}", test.test), vec!["-".to_string(); 4]));
            continue;
        }
        // The best point of a type: the fastest rowsync time among points with a limit.
        let best_point: [Option<(&Point, f64)>; 4] = std::array::from_fn(|i| {
            test.points
                .iter()
                .zip(&efficiencies)
                .filter_map(|(point, e)| Some((point, point.best_seconds()[i]?, e[i]?)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(point, _, e)| (point, e))
        });
        rows.push((
            format!("Test {} minimum", test.test),
            minimum_per_type(&efficiencies),
        ));
        let cpu: Vec<[Option<f64>; 4]> = test.points.iter().map(Point::cpu_efficiency).collect();
        if cpu.iter().flatten().any(Option::is_some) {
            rows.push((
                format!("Test {} CPU minimum", test.test),
                minimum_per_type(&cpu),
            ));
        }
        rows.push((
            format!("Test {} best point", test.test),
            best_point
                .iter()
                .map(|b| format_ratio(b.map(|(_, e)| e)))
                .collect(),
        ));
        rows.push((
            "  best point is".to_string(),
            best_point
                .iter()
                .map(|b| b.map_or_else(|| "-".to_string(), |(p, _)| p.label.clone()))
                .collect(),
        ));
    }
    if rows.is_empty() {
        out.push_str("No tests ran.\n");
    } else {
        write_table_body(out, "test", &TYPE_HEADERS, &rows);
        out.push_str(
            "(best point: the point with rowsync's smallest total server time of that type; CPU: the limit's CPU over rowsync's, the clients' left out)\n",
        );
    }
}

/// The lowest ratio of each type over the points, as printed ("-" where none).
fn minimum_per_type(ratios: &[[Option<f64>; 4]]) -> Vec<String> {
    (0..4)
        .map(|i| format_ratio(ratios.iter().filter_map(|r| r[i]).min_by(f64::total_cmp)))
        .collect()
}

/// Efficiency per type, None where rowsync or the limit was not measured.
fn efficiency(point: &Point) -> [Option<f64>; 4] {
    let limit = point.limit_seconds.unwrap_or([f64::NAN; 4]);
    let efficiency = point.efficiency();
    std::array::from_fn(|i| {
        efficiency[i].filter(|e| limit_is_measured(limit[i]) && e.is_finite() && *e > 0.0)
    })
}

/// A limit of zero, negative or not a number marks a type the limit did not measure.
fn limit_is_measured(seconds: f64) -> bool {
    seconds.is_finite() && seconds > 0.0
}

fn headers_with_sum() -> Vec<&'static str> {
    let mut headers = TYPE_HEADERS.to_vec();
    headers.push("Sum");
    headers
}

/// The four cells then the sum over the types measured ("-" when none was).
fn with_sum(values: [Option<f64>; 4], format: fn(Option<f64>) -> String) -> Vec<String> {
    let measured: Vec<f64> = values.iter().flatten().copied().collect();
    let sum = (!measured.is_empty()).then(|| measured.iter().sum());
    values.iter().copied().chain([sum]).map(format).collect()
}

/// A text field as printed: "-" when empty.
fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        text.to_string()
    }
}

fn format_seconds(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "-".to_string(), |s| format!("{s:.3}"))
}

fn format_ratio(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_string(), |r| format!("{r:.2}"))
}

fn format_percent(percent: Option<f64>) -> String {
    percent.map_or_else(|| "-".to_string(), |p| format!("{p:.1}%"))
}

/// A titled table: first column left-aligned, the others right-aligned.
fn render_table(
    out: &mut String,
    title: &str,
    first_header: &str,
    headers: &[&str],
    rows: &[(String, Vec<String>)],
) {
    let _ = writeln!(out, "\n{title}");
    write_table_body(out, first_header, headers, rows);
}

fn write_table_body(
    out: &mut String,
    first_header: &str,
    headers: &[&str],
    rows: &[(String, Vec<String>)],
) {
    let first_width = rows
        .iter()
        .map(|(label, _)| label.chars().count())
        .chain([first_header.chars().count(), FIRST_COLUMN_WIDTH_MIN])
        .max()
        .unwrap_or(FIRST_COLUMN_WIDTH_MIN);
    let widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(column, header)| {
            rows.iter()
                .filter_map(|(_, cells)| cells.get(column))
                .map(|cell| cell.chars().count())
                .chain([header.chars().count(), NUMBER_COLUMN_WIDTH_MIN])
                .max()
                .unwrap_or(NUMBER_COLUMN_WIDTH_MIN)
        })
        .collect();
    let mut line = format!("{first_header:<first_width$}");
    for (header, width) in headers.iter().zip(&widths) {
        let _ = write!(line, "  {header:>width$}");
    }
    let _ = writeln!(out, "{}", line.trim_end());
    for (label, cells) in rows {
        let mut line = format!("{label:<first_width$}");
        for (column, width) in widths.iter().enumerate() {
            let cell = cells.get(column).map_or("", String::as_str);
            let _ = write!(line, "  {cell:>width$}");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

// ---------------------------------------------------------------------------------------
// Plot

/// How the x axis places the points.
#[derive(Debug, Clone, Copy, PartialEq)]
enum XAxis {
    /// Every point has `x`, spread enough for a linear axis.
    Linear,
    /// Every point has a positive `x` spanning at least [`LOG_AXIS_SPAN_MIN`]: plotted
    /// at log10(x) with ticks at 1, 2, 5 times powers of ten.
    Log10,
    /// Every point has `x` but a linear axis would crowd them (0, 0.5, 1, ... 50): one
    /// evenly spaced tick per distinct value, in increasing order.
    EvenlySpaced,
    /// Some point has no `x` (protocols): one tick per point label, in the points' order.
    Categorical,
}

/// A linear f64 axis whose ticks sit exactly at the given positions (plotters'
/// `WithKeyPoints` over f64 has no label formatter, so the mesh cannot draw it).
#[derive(Clone)]
struct TickedAxis {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for TickedAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let fraction = if span > 0.0 {
            (value - self.range.start) / span
        } else {
            0.5
        };
        limit.0 + (f64::from(limit.1 - limit.0) * fraction).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Ticks for labels and bold grid lines; no light grid lines between them.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

/// Everything the chart draws, in plot coordinates.
struct PlotData {
    axis: XAxis,
    x_range: std::ops::Range<f64>,
    /// Tick positions and their labels.
    ticks: Vec<(f64, String)>,
    y_max: f64,
    /// Best total server time per type: (x, seconds), in increasing x.
    measured: [Vec<(f64, f64)>; 4],
    /// The limit per type, only for types with measured values, in increasing x.
    limit: [Vec<(f64, f64)>; 4],
}

/// An SVG plot of one test like the paper's figures. A test with nothing to draw (no
/// points, or no finite time) still gets a plot: its title and "no data".
pub fn plot_test(test: &TestResult, path: &Path) -> Result<(), ReportError> {
    let svg = render_svg(test).map_err(|message| ReportError::Plot {
        path: path.to_path_buf(),
        message,
    })?;
    std::fs::write(path, svg).map_err(|source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn render_svg(test: &TestResult) -> Result<String, String> {
    let title = format!("Test {}: {}", test.test, test.title);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PLOT_SIZE_PIXELS).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let body = root
            .titled(&title, ("sans-serif", 26))
            .map_err(|e| e.to_string())?;
        match plot_data(test) {
            Some(data) => draw_chart(&body, &test.parameter, &data)?,
            None => {
                let (width, height) = body.dim_in_pixel();
                let style = TextStyle::from(("sans-serif", 32).into_font())
                    .pos(Pos::new(HPos::Center, VPos::Center));
                body.draw(&Text::new(
                    "no data",
                    (width as i32 / 2, height as i32 / 2),
                    style,
                ))
                .map_err(|e| e.to_string())?;
            }
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// Rough rendered width of a label: plotters shrinks font sizes by 1.24 and an average
/// sans-serif glyph is about 0.6 em wide.
fn estimated_label_pixels(label: &str) -> u32 {
    let em = f64::from(TICK_FONT_SIZE) / 1.24;
    (label.chars().count() as f64 * em * 0.6).ceil() as u32
}

fn draw_chart<DB: DrawingBackend>(
    body: &DrawingArea<DB, Shift>,
    parameter: &str,
    data: &PlotData,
) -> Result<(), String> {
    let (width, _) = body.dim_in_pixel();
    let (chart_area, legend_area) =
        body.split_horizontally(width.saturating_sub(LEGEND_WIDTH_PIXELS));

    // Categorical labels too wide for their slot are drawn by hand, rotated.
    let widest_label = data
        .ticks
        .iter()
        .map(|(_, label)| estimated_label_pixels(label))
        .max()
        .unwrap_or(0);
    let plot_width = f64::from(chart_area.dim_in_pixel().0.saturating_sub(110));
    let slot_width = plot_width / data.ticks.len().max(1) as f64;
    let rotate_labels = matches!(data.axis, XAxis::Categorical | XAxis::EvenlySpaced)
        && f64::from(widest_label) > 0.9 * slot_width;
    let x_label_area = if rotate_labels {
        (widest_label + 50).min(220)
    } else {
        55
    };

    let mut chart = ChartBuilder::on(&chart_area)
        .margin(15)
        .x_label_area_size(x_label_area)
        .y_label_area_size(75)
        .build_cartesian_2d(
            TickedAxis {
                range: data.x_range.clone(),
                ticks: data.ticks.iter().map(|(x, _)| *x).collect(),
            },
            0.0..data.y_max,
        )
        .map_err(|e| e.to_string())?;

    let tick_label = |x: &f64| {
        if rotate_labels {
            return String::new();
        }
        data.ticks
            .iter()
            .min_by(|a, b| (a.0 - x).abs().total_cmp(&(b.0 - x).abs()))
            .map(|(_, label)| label.clone())
            .unwrap_or_default()
    };
    let y_decimals = (1.0 - data.y_max.log10().floor()).clamp(0.0, 4.0) as usize;
    let y_label = |y: &f64| format!("{y:.y_decimals$}");
    let x_desc = match data.axis {
        XAxis::Log10 => format!("{parameter} (log scale)"),
        XAxis::EvenlySpaced => format!("{parameter} (points evenly spaced)"),
        XAxis::Linear | XAxis::Categorical => parameter.to_string(),
    };
    chart
        .configure_mesh()
        .x_labels(data.ticks.len().max(1))
        .x_label_formatter(&tick_label)
        .y_labels(10)
        .y_label_formatter(&y_label)
        .max_light_lines(1)
        .label_style(("sans-serif", TICK_FONT_SIZE))
        .axis_desc_style(("sans-serif", 17))
        .x_desc(x_desc)
        .y_desc("total server time (s), best of runs")
        .draw()
        .map_err(|e| e.to_string())?;

    if rotate_labels {
        let style = TextStyle::from(("sans-serif", TICK_FONT_SIZE).into_font())
            .transform(FontTransform::Rotate90)
            .pos(Pos::new(HPos::Left, VPos::Center));
        for (x, label) in &data.ticks {
            let (pixel_x, pixel_y) = chart.backend_coord(&(*x, 0.0));
            chart_area
                .draw(&Text::new(
                    label.as_str(),
                    (pixel_x, pixel_y + 8),
                    style.clone(),
                ))
                .map_err(|e| e.to_string())?;
        }
    }

    let mut legend = Vec::new();
    for (i, sync_type) in SYNC_TYPES.iter().enumerate() {
        let color = TYPE_COLORS[i];
        if data.measured[i].is_empty() {
            continue;
        }
        chart
            .draw_series(
                LineSeries::new(data.measured[i].iter().copied(), color.stroke_width(2))
                    .point_size(4),
            )
            .map_err(|e| e.to_string())?;
        legend.push((sync_type.to_string(), color, false));
        if data.limit[i].is_empty() {
            continue;
        }
        chart
            .draw_series(DashedLineSeries::new(
                data.limit[i].iter().copied(),
                8,
                5,
                color.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        legend.push((format!("{sync_type} limit"), color, true));
    }
    draw_legend(&legend_area, &legend)
}

/// The legend beside the chart: a line sample (dashed for a limit) and the series name.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, RGBColor, bool)],
) -> Result<(), String> {
    const TOP: i32 = 30;
    const ROW_HEIGHT: i32 = 24;
    let style =
        TextStyle::from(("sans-serif", 17).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (row, (label, color, dashed)) in entries.iter().enumerate() {
        let y = TOP + ROW_HEIGHT * row as i32;
        let sample = [(8, y), (40, y)];
        if *dashed {
            area.draw(&DashedPathElement::new(sample, 6, 4, color.stroke_width(1)))
        } else {
            area.draw(&PathElement::new(sample, color.stroke_width(2)))
        }
        .map_err(|e| e.to_string())?;
        area.draw(&Text::new(label.as_str(), (48, y), style.clone()))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The plot's coordinates, or None when there is nothing to draw.
fn plot_data(test: &TestResult) -> Option<PlotData> {
    let points = &test.points;
    let xs: Option<Vec<f64>> = points
        .iter()
        .map(|p| p.x.filter(|x| x.is_finite()))
        .collect();
    let (axis, coordinates, ticks, x_range) = match xs {
        Some(xs) if !xs.is_empty() => numeric_axis(points, &xs),
        _ => {
            let coordinates: Vec<f64> = (0..points.len()).map(|i| i as f64).collect();
            let ticks = points
                .iter()
                .enumerate()
                .map(|(i, p)| (i as f64, p.label.clone()))
                .collect();
            let range = -0.5..(points.len() as f64 - 0.5);
            (XAxis::Categorical, coordinates, ticks, range)
        }
    };

    let mut measured: [Vec<(f64, f64)>; 4] = Default::default();
    let mut limit: [Vec<(f64, f64)>; 4] = Default::default();
    for (point, x) in points.iter().zip(&coordinates) {
        let best = point.best_seconds();
        for i in 0..4 {
            let Some(seconds) = best[i].filter(|s| s.is_finite() && *s >= 0.0) else {
                continue;
            };
            measured[i].push((*x, seconds));
            if let Some(seconds) = point
                .limit_seconds
                .map(|l| l[i])
                .filter(|s| limit_is_measured(*s))
            {
                limit[i].push((*x, seconds));
            }
        }
    }
    if measured.iter().all(Vec::is_empty) {
        return None;
    }
    for series in measured.iter_mut().chain(limit.iter_mut()) {
        series.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let y_high = measured
        .iter()
        .chain(&limit)
        .flatten()
        .map(|(_, y)| *y)
        .fold(0.0, f64::max);
    let y_max = if y_high > 0.0 { y_high * 1.1 } else { 1.0 };
    Some(PlotData {
        axis,
        x_range,
        ticks,
        y_max,
        measured,
        limit,
    })
}

type AxisLayout = (XAxis, Vec<f64>, Vec<(f64, String)>, std::ops::Range<f64>);

/// The axis for points that all have a finite `x`: log, linear, or evenly spaced.
fn numeric_axis(points: &[Point], xs: &[f64]) -> AxisLayout {
    let low = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let high = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if low > 0.0 && high / low >= LOG_AXIS_SPAN_MIN {
        let coordinates = xs.iter().map(|x| x.log10()).collect();
        let range = padded_range(low.log10(), high.log10());
        return (XAxis::Log10, coordinates, log_ticks(low, high), range);
    }
    let mut distinct = xs.to_vec();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let span = high - low;
    let crowded = distinct
        .windows(2)
        .any(|pair| pair[1] - pair[0] < LINEAR_AXIS_GAP_MIN * span);
    if !crowded {
        let range = padded_range(low, high);
        let ticks = linear_ticks(range.start, range.end);
        return (XAxis::Linear, xs.to_vec(), ticks, range);
    }
    let rank = |x: f64| distinct.iter().position(|d| *d == x).unwrap_or(0) as f64;
    let coordinates = xs.iter().map(|x| rank(*x)).collect();
    let ticks = distinct
        .iter()
        .map(|d| {
            let label = points
                .iter()
                .zip(xs)
                .find(|(_, x)| *x == d)
                .map_or_else(|| format!("{d}"), |(p, _)| p.label.clone());
            (rank(*d), label)
        })
        .collect();
    let range = -0.5..(distinct.len() as f64 - 0.5);
    (XAxis::EvenlySpaced, coordinates, ticks, range)
}

/// The range widened by 5% each side (a single value gets a window around it).
fn padded_range(low: f64, high: f64) -> std::ops::Range<f64> {
    let span = high - low;
    if span > 0.0 {
        (low - span * 0.05)..(high + span * 0.05)
    } else {
        let pad = (low.abs() * 0.1).max(0.5);
        (low - pad)..(high + pad)
    }
}

/// About eight ticks at 1, 2 or 5 times a power of ten.
fn linear_ticks(low: f64, high: f64) -> Vec<(f64, String)> {
    let raw_step = (high - low) / 8.0;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= raw_step)
        .unwrap_or(10.0 * magnitude);
    let decimals = (-step.log10().floor()).max(0.0) as usize;
    let first = (low / step).ceil() as i64;
    let last = (high / step).floor() as i64;
    (first..=last)
        .map(|k| {
            let x = k as f64 * step;
            (x, format!("{x:.decimals$}"))
        })
        .collect()
}

/// Ticks at 1, 2 and 5 times powers of ten within [low, high], placed at their log10.
fn log_ticks(low: f64, high: f64) -> Vec<(f64, String)> {
    let first = low.log10().floor() as i32;
    let last = high.log10().ceil() as i32;
    let mut ticks = Vec::new();
    for power in first..=last {
        for mantissa in [1.0, 2.0, 5.0] {
            let value = mantissa * 10f64.powi(power);
            if value >= low * (1.0 - 1e-9) && value <= high * (1.0 + 1e-9) {
                let decimals = (-power).max(0) as usize;
                ticks.push((value.log10(), format!("{value:.decimals$}")));
            }
        }
    }
    ticks
}

// ---------------------------------------------------------------------------------------
// Files

/// Write a run's results directory: `results.json`, `report.txt`, and `test{N}.txt` and
/// `test{N}.svg` per test. Returns the paths written, in that order.
pub fn write_results(run: &BenchRun, dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDirectory {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();

    let json_path = dir.join("results.json");
    let json = serde_json::to_string_pretty(run).map_err(|source| ReportError::Json {
        path: json_path.clone(),
        source,
    })?;
    write_file(&json_path, json + "\n")?;
    written.push(json_path);

    let report_path = dir.join("report.txt");
    write_file(&report_path, render_run(run))?;
    written.push(report_path);

    for test in &run.tests {
        let text_path = dir.join(format!("test{}.txt", test.test));
        write_file(&text_path, render_test(test))?;
        written.push(text_path);

        let plot_path = dir.join(format!("test{}.svg", test.test));
        plot_test(test, &plot_path)?;
        written.push(plot_path);
    }
    Ok(written)
}

fn write_file(path: &Path, contents: String) -> Result<(), ReportError> {
    std::fs::write(path, contents).map_err(|source| ReportError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::results::Phase;

    fn phase(sync_type: &str, seconds: f64, busy_retries: u64) -> Phase {
        Phase {
            sync_type: sync_type.to_string(),
            total_server_seconds: seconds,
            total_client_seconds: seconds + 0.25,
            client_seconds_median: 0.125,
            client_seconds_p99: 0.5,
            syncs: 100,
            rows: 10_000,
            wire_bytes: 1_000_000,
            busy_retries,
            server_cpu_seconds: 0.75,
            cpu: None,
        }
    }

    /// One run: the four types in order, None for a type not measured.
    fn run_of(seconds: [Option<f64>; 4]) -> Vec<Phase> {
        SYNC_TYPES
            .iter()
            .zip(seconds)
            .filter_map(|(name, s)| s.map(|s| phase(name, s, 0)))
            .collect()
    }

    fn all(seconds: [f64; 4]) -> [Option<f64>; 4] {
        seconds.map(Some)
    }

    fn point(label: &str, x: Option<f64>, runs: Vec<Vec<Phase>>) -> Point {
        Point {
            label: label.to_string(),
            x,
            clients: 10,
            rows_per_sync: 100,
            sets: 2,
            workers: "4".to_string(),
            connections_max: 1024,
            retry: "server hint".to_string(),
            transport: "tcp".to_string(),
            runs,
            limit_seconds: None,
            limit_cpu: None,
            server_peak_rss_bytes: 3 * 1024 * 1024,
            syncs_per_server: Vec::new(),
        }
    }

    /// Test 1 with a numeric x (5, 10, 200: a log axis), two runs at the first point, a
    /// limit at two points, busy retries at one, a type missing at one, row scripts.
    fn workers_test() -> TestResult {
        let mut five = point(
            "5",
            Some(5.0),
            vec![
                run_of(all([2.0, 8.0, 6.0, 4.0])),
                run_of(all([1.5, 9.0, 6.5, 4.5])),
            ],
        );
        five.limit_seconds = Some([0.75, 2.0, 3.0, 3.2]);
        let mut ten = point("10", Some(10.0), vec![run_of(all([1.0, 4.0, 3.0, 2.0]))]);
        ten.limit_seconds = Some([0.6, 2.0, 1.5, 1.0]);
        ten.runs[0][1].busy_retries = 7;
        let two_hundred = point(
            "200",
            Some(200.0),
            vec![run_of([Some(1.25), Some(5.0), None, Some(2.5)])],
        );
        let row_scripts = point(
            "5",
            Some(5.0),
            vec![run_of([None, Some(16.0), Some(12.0), Some(10.0)])],
        );
        TestResult {
            test: 1,
            title: "Optimal number of database workers".to_string(),
            parameter: "DB workers".to_string(),
            points: vec![five, ten, two_hundred],
            row_scripts: Some(row_scripts),
            notes: vec!["a note the reader must see".to_string()],
        }
    }

    /// Test 5 with categorical points (no x), one run each, no limit.
    fn protocol_test() -> TestResult {
        TestResult {
            test: 5,
            title: "Network protocol".to_string(),
            parameter: "Protocol".to_string(),
            points: vec![
                point("TCP", None, vec![run_of(all([1.0, 2.0, 3.0, 4.0]))]),
                point("TLS + zlib", None, vec![run_of(all([1.5, 2.5, 3.5, 4.5]))]),
            ],
            row_scripts: None,
            notes: Vec::new(),
        }
    }

    fn sample_run() -> BenchRun {
        BenchRun {
            size: "quick".to_string(),
            client_mode: "sqlite".to_string(),
            wire_bytes_per_row: 87.5,
            started: "2025-01-02T03:04:05+00:00".to_string(),
            machine: "test machine, 2 cores".to_string(),
            tests: vec![workers_test(), protocol_test()],
        }
    }

    /// The cells after `label` on its row in the table whose title line contains `title`.
    fn cells(text: &str, title: &str, label: &str) -> Vec<String> {
        let mut lines = text.lines().skip_while(|line| !line.contains(title));
        assert!(
            lines.next().is_some(),
            "no table titled {title:?} in:\n{text}"
        );
        let row = lines
            .take_while(|line| !line.trim().is_empty())
            .find(|line| {
                line.strip_prefix(label)
                    .is_some_and(|rest| rest.starts_with("  "))
            })
            .unwrap_or_else(|| panic!("no row {label:?} in table {title:?} in:\n{text}"));
        row[label.len()..]
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    /// How plotters' SVG backend writes a text element's content.
    fn svg_text(text: &str) -> String {
        format!(">\n{text}\n</text>")
    }

    fn assert_valid_svg(svg: &str) {
        assert!(svg.starts_with("<svg"), "not an SVG document: {svg:.80}");
        assert!(svg.trim_end().ends_with("</svg>"), "SVG not closed");
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
        assert!(svg.contains("xmlns=\"http://www.w3.org/2000/svg\""));
    }

    #[test]
    fn table_holds_best_times_sums_and_efficiency() {
        let text = render_test(&workers_test());
        let times = "Total server time (s), best of the runs";
        // Best of the two runs at 5 workers, per type: min(2.0, 1.5) and so on.
        let best_five = [1.5_f64, 8.0, 6.0, 4.0];
        let mut expected: Vec<String> = best_five.iter().map(|s| format!("{s:.3}")).collect();
        expected.push(format!("{:.3}", best_five.iter().sum::<f64>()));
        assert_eq!(cells(&text, times, "5"), expected);
        assert_eq!(
            cells(&text, times, "10"),
            strings(&["1.000", "4.000", "3.000", "2.000", "10.000"])
        );
        // Delete not measured at 200: "-", and the sum covers the measured types.
        assert_eq!(
            cells(&text, times, "200"),
            strings(&["1.250", "5.000", "-", "2.500", "8.750"])
        );

        let limit = "Limit (PostgreSQL bulk path, same run)";
        assert_eq!(
            cells(&text, limit, "5"),
            strings(&["0.750", "2.000", "3.000", "3.200", "8.950"])
        );
        assert!(
            !text
                .lines()
                .skip_while(|l| !l.contains(limit))
                .take_while(|l| !l.is_empty())
                .any(|l| l.starts_with("200 ")),
            "a point without a limit has no limit row"
        );

        let efficiency = "Efficiency = limit / rowsync";
        let expected_five: Vec<String> = [0.75 / 1.5, 2.0 / 8.0, 3.0 / 6.0, 3.2 / 4.0]
            .iter()
            .map(|e| format!("{e:.2}"))
            .collect();
        assert_eq!(cells(&text, efficiency, "5"), expected_five);
        assert_eq!(
            cells(&text, efficiency, "10"),
            strings(&["0.60", "0.50", "0.50", "0.50"])
        );
    }

    fn usage(server: f64, database: f64, bench: f64, busy: f64, wall: f64) -> CpuUsage {
        CpuUsage {
            server_seconds: server,
            database_seconds: Some(database),
            bench_seconds: bench,
            machine_busy_seconds: busy,
            wall_seconds: wall,
        }
    }

    #[test]
    fn cpu_efficiency_leaves_the_clients_out_and_is_absent_where_unmeasured() {
        let mut test = workers_test();
        // At 10 workers: each phase used server 1 s, PostgreSQL 2 s, clients 5 s.
        for phase in &mut test.points[1].runs[0] {
            phase.cpu = Some(usage(1.0, 2.0, 5.0, 3.6, 2.0));
        }
        // The limit: PostgreSQL 1.5 s and its driver 0.3 s for each type but insert.
        let mut limit = [usage(0.0, 1.5, 0.3, 1.0, 1.0); 4];
        limit[3] = usage(0.0, 2.4, 0.6, 2.0, 1.5);
        test.points[1].limit_cpu = Some(limit);
        // At 5 workers the database ran elsewhere: nothing to compare.
        test.points[0].limit_cpu = Some([CpuUsage::default(); 4]);
        let text = render_test(&test);
        let title = "CPU efficiency = limit CPU";
        assert_eq!(
            cells(&text, title, "10"),
            strings(&["0.60", "0.60", "0.60", "1.00"])
        );
        assert!(
            !text
                .lines()
                .skip_while(|l| !l.contains(title))
                .take_while(|l| !l.is_empty())
                .any(|l| l.starts_with("5 ")),
            "a point without database CPU has no CPU efficiency row"
        );
        // The phase's own CPU columns: PostgreSQL, clients, cores busy (3.6 / 2.0).
        let block = "DB workers = 10: server peak RSS 3.0 MiB";
        let download = cells(&text, block, "  download");
        assert_eq!(download[6..], strings(&["2.000", "5.000", "1.80"]));
        let after_block = &text[text.find(block).unwrap()..];
        assert_eq!(
            cells(after_block, "  limit", "  insert"),
            strings(&["2.400", "0.600", "1.33"])
        );
        let mut run = sample_run();
        run.tests[0] = test;
        assert_eq!(
            cells(
                &render_run(&run),
                "Efficiency per sync type",
                "Test 1 CPU minimum"
            ),
            strings(&["0.60", "0.60", "0.60", "1.00"])
        );
        assert!(!render_run(&sample_run()).contains("CPU minimum"));
    }

    #[test]
    fn rsd_retries_throughput_row_scripts_notes_and_paper_are_reported() {
        let text = render_test(&workers_test());

        // RSD at 5 workers from the two runs, computed here with the sample formula.
        let rsd = |a: f64, b: f64| {
            let mean = (a + b) / 2.0;
            let variance = ((a - mean).powi(2) + (b - mean).powi(2)) / 1.0;
            format!("{:.1}%", 100.0 * variance.sqrt() / mean)
        };
        let expected = vec![rsd(2.0, 1.5), rsd(8.0, 9.0), rsd(6.0, 6.5), rsd(4.0, 4.5)];
        assert_eq!(expected[0], "20.2%");
        assert_eq!(
            cells(&text, "Relative standard deviation", "5 (2 runs)"),
            expected
        );
        assert!(!text.contains("10 (1 runs)"), "one run has no RSD row");

        let retries = "Busy answers the clients retried";
        assert_eq!(cells(&text, retries, "10"), strings(&["0", "7", "0", "0"]));

        // Throughput of the best download at 5 workers (1.5 s): 100 syncs, 10000 rows, 1 MB.
        let block = "DB workers = 5: server peak RSS 3.0 MiB";
        assert_eq!(
            cells(&text, block, "  download"),
            vec![
                format!("{:.1}", 100.0 / 1.5),
                format!("{:.0}", 10_000.0 / 1.5),
                format!("{:.2}", 1.0 / 1.5),
                "0.125".to_string(),
                "0.500".to_string(),
                "0.750".to_string(),
                // CPU by whom was not measured in this run.
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
            ]
        );

        let scripts = "Row scripts (one statement per row) vs set scripts at DB workers = 5";
        assert_eq!(
            cells(&text, scripts, "row scripts"),
            strings(&["-", "16.000", "12.000", "10.000"])
        );
        assert_eq!(
            cells(&text, scripts, "set scripts"),
            strings(&["1.500", "8.000", "6.000", "4.000"])
        );
        assert!(text.contains("update: set scripts are 2.0x faster"));
        assert!(text.contains("insert: set scripts are 2.5x faster"));
        assert!(!text.contains("download: set scripts"));

        assert!(text.contains("- a note the reader must see"));

        // The paper's Tables 2 to 4, each under the published label.
        for number in [2, 3, 4] {
            let caption = format!("Table {number}: ");
            let at = text.find(&caption).expect("published table present");
            let next_line = text[at..].lines().nth(1).expect("label line");
            assert_eq!(next_line, PUBLISHED_LABEL);
        }
        assert_eq!(
            cells(&text, "Table 2: ", "75"),
            strings(&["26.3", "148.9", "102.7", "102.6", "380.5"])
        );
        assert_eq!(
            cells(&text, "Table 4: ", "Auto 25-100"),
            strings(&["2.0%", "5.7%", "15.6%", "0.9%"])
        );
        assert!(!text.contains("Table 5: "));
    }

    #[test]
    fn run_has_header_every_test_and_the_efficiency_summary() {
        let text = render_run(&sample_run());
        assert!(text.contains("wire bytes per row:  87.5 (the paper: 92)"));
        assert!(text.contains("client mode:         sqlite"));
        assert!(text.contains("Test 1: Optimal number of database workers"));
        assert!(text.contains("Test 5: Network protocol"));
        assert!(text.contains("Table 16: "));

        let summary = "Efficiency per sync type";
        // Minimum over the points with a limit: 5 -> 0.50 0.25 0.50 0.80, 10 -> 0.60 0.50
        // 0.50 0.50.
        assert_eq!(
            cells(&text, summary, "Test 1 minimum"),
            strings(&["0.50", "0.25", "0.50", "0.50"])
        );
        // Rowsync's fastest point of every type with a limit is 10 workers.
        assert_eq!(
            cells(&text, summary, "Test 1 best point"),
            strings(&["0.60", "0.50", "0.50", "0.50"])
        );
        assert_eq!(
            cells(&text, summary, "  best point is"),
            strings(&["10", "10", "10", "10"])
        );
        assert_eq!(
            cells(&text, summary, "Test 5"),
            strings(&["-", "-", "-", "-"])
        );
    }

    #[test]
    fn numeric_plot_is_an_svg_with_every_type_and_the_limit() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("test1.svg");
        plot_test(&workers_test(), &path).expect("plot written");
        let svg = std::fs::read_to_string(&path).expect("plot readable");
        assert_valid_svg(&svg);
        assert!(svg.contains("Test 1: Optimal number of database workers"));
        for sync_type in SYNC_TYPES {
            assert!(svg.contains(&svg_text(sync_type)), "{sync_type}");
            assert!(
                svg.contains(&svg_text(&format!("{sync_type} limit"))),
                "{sync_type}"
            );
        }
        // 5 to 200 spans 40x: a log axis with ticks at 1-2-5 steps.
        assert!(svg.contains("DB workers (log scale)"));
        for tick in ["5", "10", "20", "50", "100", "200"] {
            assert!(svg.contains(&svg_text(tick)), "tick {tick}");
        }
    }

    #[test]
    fn categorical_plot_has_one_tick_per_label() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("test5.svg");
        plot_test(&protocol_test(), &path).expect("plot written");
        let svg = std::fs::read_to_string(&path).expect("plot readable");
        assert_valid_svg(&svg);
        for sync_type in SYNC_TYPES {
            assert!(svg.contains(&svg_text(sync_type)), "{sync_type}");
        }
        assert!(
            !svg.contains(" limit\n</text>"),
            "no limit measured, none drawn"
        );
        assert!(svg.contains(&svg_text("TCP")));
        assert!(svg.contains(&svg_text("TLS + zlib")));
    }

    #[test]
    fn crowded_numbers_are_spaced_evenly_and_long_labels_rotated() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let delays = [("0", 0.0), ("0.5", 0.5), ("5", 5.0), ("50", 50.0)];
        let retry = TestResult {
            test: 2,
            title: "Retry delay".to_string(),
            parameter: "Retry delay (s)".to_string(),
            // Out of order on purpose: the plot sorts by x.
            points: delays
                .iter()
                .rev()
                .map(|(label, x)| point(label, Some(*x), vec![run_of(all([1.0, 2.0, 3.0, *x]))]))
                .collect(),
            ..TestResult::default()
        };
        let path = dir.path().join("test2.svg");
        plot_test(&retry, &path).expect("plot written");
        let svg = std::fs::read_to_string(&path).expect("plot readable");
        assert_valid_svg(&svg);
        assert!(svg.contains("Retry delay (s) (points evenly spaced)"));
        for (label, _) in delays {
            assert!(svg.contains(&svg_text(label)), "tick {label}");
        }

        let labels = [
            "TCPIP",
            "TCPIP + zlib",
            "HTTP",
            "HTTP + zlib",
            "TLS:ECC + zlib",
            "TLS:RSA + zlib",
            "TLS:FIPS + zlib",
            "HTTPS:FIPS + zlib",
        ];
        let mut protocols = protocol_test();
        protocols.points = labels
            .iter()
            .map(|label| point(label, None, vec![run_of(all([1.0, 2.0, 3.0, 4.0]))]))
            .collect();
        let path = dir.path().join("test5.svg");
        plot_test(&protocols, &path).expect("plot written");
        let svg = std::fs::read_to_string(&path).expect("plot readable");
        assert_valid_svg(&svg);
        assert!(svg.contains("rotate(90"), "crowded labels are rotated");
        for label in labels {
            assert!(svg.contains(&svg_text(label)), "label {label}");
        }
    }

    #[test]
    fn plots_of_no_points_one_point_and_zero_times_are_written() {
        let dir = tempfile::tempdir().expect("temporary directory");

        let empty = TestResult {
            test: 3,
            title: "Scalability".to_string(),
            parameter: "Clients".to_string(),
            ..TestResult::default()
        };
        let path = dir.path().join("empty.svg");
        plot_test(&empty, &path).expect("empty test still gets a plot");
        let svg = std::fs::read_to_string(&path).expect("plot readable");
        assert_valid_svg(&svg);
        assert!(svg.contains(&svg_text("no data")));
        assert!(svg.contains("Test 3: Scalability"));
        let text = render_test(&empty);
        assert!(text.contains("No points were measured."));
        assert!(text.contains("Table 9: ") && text.contains("Table 10: "));

        let mut zero = empty.clone();
        zero.points = vec![point("1000", Some(1000.0), vec![run_of(all([0.0; 4]))])];
        let path = dir.path().join("zero.svg");
        plot_test(&zero, &path).expect("one point of zero times");
        let svg = std::fs::read_to_string(&path).expect("plot readable");
        assert_valid_svg(&svg);
        assert!(!svg.contains(&svg_text("no data")));
        for sync_type in SYNC_TYPES {
            assert!(svg.contains(&svg_text(sync_type)), "{sync_type}");
        }

        let mut unmeasured = zero.clone();
        unmeasured.points = vec![point("TCP", None, Vec::new())];
        let path = dir.path().join("unmeasured.svg");
        plot_test(&unmeasured, &path).expect("a point with no runs");
        let svg = std::fs::read_to_string(&path).expect("plot readable");
        assert!(svg.contains(&svg_text("no data")));
        assert!(render_test(&unmeasured).contains("no sync type measured"));
    }

    #[test]
    fn results_directory_round_trips_the_json() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let out = dir.path().join("nested").join("run");
        let run = sample_run();
        let written = write_results(&run, &out).expect("results written");
        let names: Vec<String> = written
            .iter()
            .map(|p| {
                assert_eq!(p.parent(), Some(out.as_path()));
                p.file_name()
                    .expect("file name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(
            names,
            strings(&[
                "results.json",
                "report.txt",
                "test1.txt",
                "test1.svg",
                "test5.txt",
                "test5.svg"
            ])
        );
        for path in &written {
            let size = std::fs::metadata(path).expect("file exists").len();
            assert!(size > 0, "{} is empty", path.display());
        }

        let json = std::fs::read_to_string(out.join("results.json")).expect("json readable");
        let back: BenchRun = serde_json::from_str(&json).expect("json parses as a BenchRun");
        assert_eq!(
            serde_json::to_value(&back).expect("value"),
            serde_json::to_value(&run).expect("value")
        );
        let report = std::fs::read_to_string(out.join("report.txt")).expect("report readable");
        assert_eq!(report, render_run(&run));
        let test5 = std::fs::read_to_string(out.join("test5.txt")).expect("test5 readable");
        assert_eq!(test5, render_test(&run.tests[1]));
    }

    #[test]
    fn a_path_that_cannot_be_created_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("a file");
        std::fs::write(&file, "not a directory").expect("file written");
        let target = file.join("results");
        let error = write_results(&sample_run(), &target).expect_err("cannot create under a file");
        assert!(matches!(error, ReportError::CreateDirectory { ref path, .. } if *path == target));
        assert!(error.to_string().contains(&target.display().to_string()));
    }
}
