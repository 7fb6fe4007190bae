//! bench-store's tables (beside the seed's published figures), SVG plots (one per
//! table) and results.json.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::prelude::*;

use super::kv::{KvPoint, Phase};
use super::tpcb::TpcbPoint;
use super::{mean_and_deviation, seed, Mode, StoreResults};

const PLOT_SIZE_PIXELS: (u32, u32) = (900, 560);
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
/// The write phases whose tracked/untracked cost ratio the tables give.
const RATIO_PHASES: [Phase; 3] = [Phase::Insert, Phase::Update, Phase::Delete];

/// Every table as text.
pub fn tables(results: &StoreResults) -> String {
    let mut text = String::new();
    let size = &results.size;
    let _ = writeln!(
        text,
        "rowsync-bench store, size {} ({} records of 64-byte keys and values, batches of 10 \
         records, one transaction per batch; rates in records per second)\n",
        size.name, size.records
    );
    one_thread_table(&mut text, results);
    thread_tables(&mut text, results);
    tpcb_table(&mut text, results);
    upload_table(&mut text, results);
    text
}

fn modes(results: &StoreResults) -> Vec<Mode> {
    let mut modes: Vec<Mode> = Vec::new();
    for point in &results.kv {
        if !modes.contains(&point.mode) {
            modes.push(point.mode);
        }
    }
    modes
}

fn kv_point(
    results: &StoreResults,
    mode: Mode,
    tracked: bool,
    threads: usize,
    phase: Phase,
) -> Option<&KvPoint> {
    results.kv.iter().find(|p| {
        p.mode == mode && p.tracked == tracked && p.threads == threads && p.phase == phase
    })
}

fn rate(point: Option<&KvPoint>) -> Option<f64> {
    point.map(|p| mean_and_deviation(&p.records_per_second).0)
}

fn cell(values: Option<&[f64]>) -> String {
    match values {
        Some(values) if values.len() > 1 => {
            let (mean, deviation) = mean_and_deviation(values);
            format!("{mean:.0} ±{deviation:.0}")
        }
        Some([value]) => format!("{value:.0}"),
        _ => "-".into(),
    }
}

fn one_thread_table(text: &mut String, results: &StoreResults) {
    let _ = writeln!(text, "Table A: one thread, by durability mode (as the seed's Table 4); ratio = tracked cost / untracked cost");
    let _ = writeln!(
        text,
        "{:<20} {:<10} {:>14} {:>14} {:>14} {:>14} {:>14}",
        "mode", "table", "insert", "fetch", "update", "delete", "reinsert"
    );
    for mode in modes(results) {
        for tracked in [false, true] {
            let cells: Vec<String> = Phase::ALL
                .iter()
                .map(|&phase| {
                    cell(
                        kv_point(results, mode, tracked, 1, phase)
                            .map(|p| &p.records_per_second[..]),
                    )
                })
                .collect();
            let kind = if tracked { "tracked" } else { "untracked" };
            let _ = writeln!(
                text,
                "{:<20} {:<10} {:>14} {:>14} {:>14} {:>14} {:>14}",
                mode.label(),
                kind,
                cells[0],
                cells[1],
                cells[2],
                cells[3],
                cells[4]
            );
        }
        let ratios: Vec<String> = Phase::ALL
            .iter()
            .map(|&phase| match cost_ratio(results, mode, 1, phase) {
                Some(ratio) => format!("x{ratio:.2}"),
                None => "-".into(),
            })
            .collect();
        let _ = writeln!(
            text,
            "{:<20} {:<10} {:>14} {:>14} {:>14} {:>14} {:>14}",
            "", "ratio", ratios[0], ratios[1], ratios[2], ratios[3], ratios[4]
        );
    }
    let _ = writeln!(
        text,
        "\n{}: Tables 3 and 4, operations per second",
        seed::LABEL
    );
    for row in std::iter::once(&seed::TABLE_3).chain(&seed::TABLE_4) {
        let pair = |(mean, sd): (f64, f64)| format!("{mean:.0} ±{sd:.0}");
        let _ = writeln!(
            text,
            "{:<31} {:>14} {:>14} {:>14} {:>14}",
            row.label,
            pair(row.insert),
            pair(row.fetch),
            pair(row.update),
            pair(row.delete)
        );
    }
    let _ = writeln!(text);
}

/// Untracked rate / tracked rate: how many times a tracked operation costs.
pub fn cost_ratio(results: &StoreResults, mode: Mode, threads: usize, phase: Phase) -> Option<f64> {
    let untracked = rate(kv_point(results, mode, false, threads, phase))?;
    let tracked = rate(kv_point(results, mode, true, threads, phase))?;
    Some(untracked / tracked)
}

fn thread_tables(text: &mut String, results: &StoreResults) {
    let _ = writeln!(
        text,
        "Table B: threads (as the seed's Table 5), records per second"
    );
    for mode in modes(results) {
        for tracked in [false, true] {
            let kind = if tracked { "tracked" } else { "untracked" };
            let _ = writeln!(text, "{} {kind}:", mode.label());
            let _ = writeln!(
                text,
                "{:>8} {:>14} {:>14} {:>14} {:>14} {:>14}",
                "threads", "insert", "fetch", "update", "delete", "reinsert"
            );
            for &threads in &results.size.threads {
                let cells: Vec<String> = Phase::ALL
                    .iter()
                    .map(|&phase| {
                        cell(
                            kv_point(results, mode, tracked, threads, phase)
                                .map(|p| &p.records_per_second[..]),
                        )
                    })
                    .collect();
                if cells.iter().all(|c| c == "-") {
                    continue;
                }
                let _ = writeln!(
                    text,
                    "{threads:>8} {:>14} {:>14} {:>14} {:>14} {:>14}",
                    cells[0], cells[1], cells[2], cells[3], cells[4]
                );
            }
        }
    }
    let _ = writeln!(
        text,
        "\n{}: Table 5, TDS (synchronous commits), operations per second",
        seed::LABEL
    );
    let _ = writeln!(
        text,
        "{:>8} {:>14} {:>14} {:>14} {:>14}",
        "threads", "insert", "fetch", "update", "delete"
    );
    for (threads, insert, fetch, delete, update) in seed::TABLE_5 {
        let _ = writeln!(
            text,
            "{threads:>8} {insert:>14.0} {fetch:>14.0} {update:>14.0} {delete:>14.0}"
        );
    }
    let _ = writeln!(text);
}

fn tpcb_point(
    results: &StoreResults,
    mode: Mode,
    tracked: bool,
    threads: usize,
) -> Option<&TpcbPoint> {
    results
        .tpcb
        .iter()
        .find(|p| p.mode == mode && p.tracked == tracked && p.threads == threads)
}

fn tpcb_table(text: &mut String, results: &StoreResults) {
    let scale = results.size.tpcb_scale;
    let _ = writeln!(text, "Table C: TPC-B-like transactions per second ({} branches, {} tellers, {} accounts; {} transactions per point), untracked / tracked", scale.branches, scale.tellers, scale.accounts, results.size.tpcb_transactions);
    let modes = modes(results);
    let mut header = format!("{:>8}", "threads");
    for mode in &modes {
        let _ = write!(header, " {:>24}", mode.label());
    }
    let _ = writeln!(text, "{header}");
    for &threads in &results.size.tpcb_threads {
        let mut line = format!("{threads:>8}");
        for &mode in &modes {
            let of =
                |tracked| cell(tpcb_point(results, mode, tracked, threads).map(|p| &p.tps[..]));
            let _ = write!(line, " {:>24}", format!("{} / {}", of(false), of(true)));
        }
        let _ = writeln!(text, "{line}");
    }
    let _ = writeln!(text, "\n{}: Table 6, TPS", seed::LABEL);
    for (threads, tps) in seed::TABLE_6 {
        let _ = writeln!(text, "{threads:>8} {tps:>10.2}");
    }
    let _ = writeln!(text);
}

fn upload_table(text: &mut String, results: &StoreResults) {
    let _ = writeln!(text, "Table D: the sync after each phase (one thread, tracked), milliseconds; records changed per phase: {}", results.size.records);
    let _ = writeln!(
        text,
        "{:<20} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "mode", "insert", "update", "delete", "reinsert", "TPC-B"
    );
    for mode in modes(results) {
        let of = |phase| {
            cell(
                kv_point(results, mode, true, 1, phase)
                    .map(|p| &p.upload_ms[..])
                    .filter(|v| !v.is_empty()),
            )
        };
        let tpcb = cell(
            tpcb_point(results, mode, true, 1)
                .map(|p| &p.upload_ms[..])
                .filter(|v| !v.is_empty()),
        );
        let _ = writeln!(
            text,
            "{:<20} {:>10} {:>10} {:>10} {:>10} {:>10}",
            mode.label(),
            of(Phase::Insert),
            of(Phase::Update),
            of(Phase::Delete),
            of(Phase::Reinsert),
            tpcb
        );
    }
    let _ = writeln!(text);
}

/// A line chart over categories: `(name, value per category)` series, log y axis.
struct Chart {
    file: String,
    title: String,
    x_label: String,
    y_label: String,
    categories: Vec<String>,
    series: Vec<(String, Vec<Option<f64>>)>,
}

/// Writes results.json, report.txt and the plots into `directory`.
pub fn write(directory: &Path, results: &StoreResults, text: &str) -> Result<()> {
    std::fs::create_dir_all(directory)
        .with_context(|| format!("creating {}", directory.display()))?;
    let write = |name: &str, content: &[u8]| {
        let path = directory.join(name);
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))
    };
    write(
        "results.json",
        serde_json::to_string_pretty(results)?.as_bytes(),
    )?;
    write("report.txt", text.as_bytes())?;
    for chart in charts(results) {
        let svg =
            render(&chart).map_err(|error| anyhow::anyhow!("plotting {}: {error}", chart.file))?;
        write(&chart.file, svg.as_bytes())?;
    }
    Ok(())
}

fn charts(results: &StoreResults) -> Vec<Chart> {
    let modes = modes(results);
    let labels: Vec<String> = modes.iter().map(Mode::label).collect();
    let mut one_thread = Vec::new();
    for tracked in [false, true] {
        for phase in Phase::ALL {
            let kind = if tracked { "tracked" } else { "untracked" };
            let values = modes
                .iter()
                .map(|&m| rate(kv_point(results, m, tracked, 1, phase)))
                .collect();
            one_thread.push((format!("{} {kind}", phase.name()), values));
        }
    }
    let thread_labels: Vec<String> = results.size.threads.iter().map(usize::to_string).collect();
    let mut charts = vec![Chart {
        file: "store-one-thread.svg".into(),
        title: "Table A: one thread, by durability mode".into(),
        x_label: "mode".into(),
        y_label: "records per second (log scale)".into(),
        categories: labels.clone(),
        series: one_thread,
    }];
    for &mode in &modes {
        let series = [false, true]
            .into_iter()
            .flat_map(|tracked| Phase::ALL.into_iter().map(move |phase| (tracked, phase)))
            .map(|(tracked, phase)| {
                let kind = if tracked { "tracked" } else { "untracked" };
                let values = results
                    .size
                    .threads
                    .iter()
                    .map(|&t| rate(kv_point(results, mode, tracked, t, phase)))
                    .collect();
                (format!("{} {kind}", phase.name()), values)
            })
            .collect();
        charts.push(Chart {
            file: format!(
                "store-threads-{}.svg",
                mode.label()
                    .replace([' ', '(', ')'], "-")
                    .replace("--", "-")
                    .trim_end_matches('-')
            ),
            title: format!("Table B: threads, mode {}", mode.label()),
            x_label: "threads".into(),
            y_label: "records per second (log scale)".into(),
            categories: thread_labels.clone(),
            series,
        });
    }
    let tpcb_series = modes
        .iter()
        .flat_map(|&mode| [false, true].map(|tracked| (mode, tracked)))
        .map(|(mode, tracked)| {
            let kind = if tracked { "tracked" } else { "untracked" };
            let values = results
                .size
                .tpcb_threads
                .iter()
                .map(|&t| {
                    tpcb_point(results, mode, tracked, t).map(|p| mean_and_deviation(&p.tps).0)
                })
                .collect();
            (format!("{} {kind}", mode.label()), values)
        })
        .collect();
    charts.push(Chart {
        file: "store-tpcb.svg".into(),
        title: "Table C: TPC-B-like transactions per second".into(),
        x_label: "threads".into(),
        y_label: "transactions per second (log scale)".into(),
        categories: results
            .size
            .tpcb_threads
            .iter()
            .map(usize::to_string)
            .collect(),
        series: tpcb_series,
    });
    let upload_phases = [Phase::Insert, Phase::Update, Phase::Delete, Phase::Reinsert];
    let upload_series = modes
        .iter()
        .map(|&mode| {
            let values = upload_phases
                .iter()
                .map(|&phase| {
                    kv_point(results, mode, true, 1, phase)
                        .filter(|p| !p.upload_ms.is_empty())
                        .map(|p| mean_and_deviation(&p.upload_ms).0)
                })
                .collect();
            (mode.label(), values)
        })
        .collect();
    charts.push(Chart {
        file: "store-upload.svg".into(),
        title: "Table D: the sync after each phase".into(),
        x_label: "phase".into(),
        y_label: "milliseconds (log scale)".into(),
        categories: upload_phases.iter().map(|p| p.name().to_string()).collect(),
        series: upload_series,
    });
    charts
}

fn render(chart: &Chart) -> Result<String, String> {
    let values: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .filter(|v| *v > 0.0)
        .collect();
    let low = values
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .min(1.0e9);
    let high = values.iter().copied().fold(0.0, f64::max).max(low * 10.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, PLOT_SIZE_PIXELS).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let count = chart.categories.len().max(1);
        let mut area = ChartBuilder::on(&root)
            .caption(&chart.title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (0..count - 1).into_segmented(),
                (low / 2.0..high * 2.0).log_scale(),
            )
            .map_err(|e| e.to_string())?;
        let label = |value: &SegmentValue<usize>| match value {
            SegmentValue::CenterOf(index) => {
                chart.categories.get(*index).cloned().unwrap_or_default()
            }
            _ => String::new(),
        };
        area.configure_mesh()
            .x_labels(count)
            .x_label_formatter(&label)
            .x_desc(chart.x_label.as_str())
            .y_desc(chart.y_label.as_str())
            .draw()
            .map_err(|e| e.to_string())?;
        for (index, (name, values)) in chart.series.iter().enumerate() {
            let color = COLORS[index % COLORS.len()];
            let style = if (index / COLORS.len()).is_multiple_of(2) {
                color.stroke_width(2)
            } else {
                color.stroke_width(1)
            };
            let points: Vec<(SegmentValue<usize>, f64)> = values
                .iter()
                .enumerate()
                .filter_map(|(i, v)| {
                    v.filter(|v| *v > 0.0)
                        .map(|v| (SegmentValue::CenterOf(i), v))
                })
                .collect();
            area.draw_series(LineSeries::new(points, style).point_size(3))
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
        }
        area.configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// The cost ratios the closing note asks for, per mode: insert, update, delete.
pub fn ratios(results: &StoreResults) -> Vec<(Mode, [Option<f64>; 3])> {
    modes(results)
        .into_iter()
        .map(|mode| {
            (
                mode,
                RATIO_PHASES.map(|phase| cost_ratio(results, mode, 1, phase)),
            )
        })
        .collect()
}
