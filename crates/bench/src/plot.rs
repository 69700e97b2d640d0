//! SVG plots of bench and replay runs: utilisation and time per round as the
//! device fills, one line per engine.
//!
//! Two panels share the x axis (rounds):
//!
//! 1. utilisation (%) at the end of each round — where each engine's line
//!    stops is where it ran out of space (the legend gives the utilisation
//!    at its first failure);
//! 2. seconds spent in the engine per round, on a log scale, so that an
//!    engine 100× slower than another stays readable.
//!
//! Text is drawn by the SVG viewer (plotters without font libraries:
//! layout uses estimated glyph widths), so the file needs nothing else.

use blockalloc::ErrorClass;
use std::path::{Path, PathBuf};

use crate::config::RoundRecord;
use crate::report::RunReport;
use plotters::prelude::*;

/// Most points drawn per line; longer runs are thinned evenly (the first and
/// last rounds always stay).
pub const MAX_POINTS: usize = 2000;

/// One engine's line.
#[derive(Clone, Debug, PartialEq)]
pub struct PlotSeries {
    /// Legend label (engine name).
    pub name: String,
    /// The rounds.
    pub rounds: Vec<RoundRecord>,
    /// Utilisation at the first failed allocation, if any.
    pub failure: Option<f64>,
}

impl From<&RunReport> for PlotSeries {
    fn from(r: &RunReport) -> Self {
        let name = if r.threads > 1 {
            format!("{} x{}", r.engine, r.threads)
        } else {
            r.engine.clone()
        };
        PlotSeries {
            name,
            rounds: r.per_round.clone(),
            failure: r.utilization_at_first_failure,
        }
    }
}

/// Titles of a plot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlotSpec {
    /// First line of the title.
    pub title: String,
    /// Second line (device, workload, …).
    pub subtitle: String,
    /// What one round is, for the x axis label.
    pub x_label: String,
}

/// Drawing or writing the plot failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlotError {
    /// The plotting library refused (should not happen with valid data).
    #[error("cannot draw the plot: {0}")]
    Draw(String),
    /// Writing the file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl PlotError {
    /// What kind of failure this is: [`ErrorClass::Io`] when the file
    /// could not be written, [`ErrorClass::Bug`] when drawing failed.
    pub fn class(&self) -> ErrorClass {
        match self {
            PlotError::Draw(_) => ErrorClass::Bug,
            PlotError::Io { .. } => ErrorClass::Io,
        }
    }
}

fn draw_err<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

/// Distinct, colour-blind-friendly colours (Okabe–Ito, black replaced: the
/// axes are black).
const COLORS: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(117, 112, 179),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
];

/// The colour of the `i`-th series (as `#rrggbb`), for tests.
#[cfg(test)]
fn series_color(i: usize) -> String {
    let c = COLORS[i % COLORS.len()];
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

fn thin(rounds: &[RoundRecord]) -> Vec<&RoundRecord> {
    if rounds.len() <= MAX_POINTS {
        return rounds.iter().collect();
    }
    let step = rounds.len().div_ceil(MAX_POINTS);
    let mut v: Vec<&RoundRecord> = rounds.iter().step_by(step).collect();
    if let Some(last) = rounds.last() {
        if v.last().map(|r| r.round) != Some(last.round) {
            v.push(last);
        }
    }
    v
}

/// `0.00012` as `120 µs`.
fn duration_label(secs: f64) -> String {
    let (v, unit) = if secs >= 1.0 {
        (secs, "s")
    } else if secs >= 1e-3 {
        (secs * 1e3, "ms")
    } else if secs >= 1e-6 {
        (secs * 1e6, "µs")
    } else {
        (secs * 1e9, "ns")
    };
    if v >= 10.0 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

/// Renders the plot as SVG text.
///
/// # Errors
/// [`PlotError::Draw`].
pub fn render_svg(spec: &PlotSpec, series: &[PlotSeries]) -> Result<String, PlotError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1100, 900)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let title_style = ("sans-serif", 22).into_font();
        let (top, rest) = root.split_vertically(60);
        top.draw(&Text::new(spec.title.clone(), (20, 8), title_style))
            .map_err(draw_err)?;
        top.draw(&Text::new(
            spec.subtitle.clone(),
            (20, 36),
            ("sans-serif", 15).into_font().color(&RGBColor(80, 80, 80)),
        ))
        .map_err(draw_err)?;
        let panels = rest.split_evenly((2, 1));

        let max_round = series
            .iter()
            .filter_map(|s| s.rounds.last().map(|r| r.round))
            .max()
            .unwrap_or(1)
            .max(1);
        let x_range = 0f64..max_round as f64;

        // Panel 1: utilisation.
        let mut chart = ChartBuilder::on(&panels[0])
            .caption("Utilisation at the end of each round", ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.clone(), 0f64..100f64)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc(spec.x_label.as_str())
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_desc("used / capacity (%)")
            .y_label_formatter(&|v| format!("{v:.0}"))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(draw_err)?;
        for (i, s) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let label = match s.failure {
                Some(u) => format!("{} (first failure at {:.3}%)", s.name, u * 100.0),
                None => format!("{} (no failure)", s.name),
            };
            chart
                .draw_series(LineSeries::new(
                    thin(&s.rounds)
                        .into_iter()
                        .map(|r| (r.round as f64, r.utilization * 100.0)),
                    color.stroke_width(2),
                ))
                .map_err(draw_err)?
                .label(label)
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 3), (x + 18, y + 3)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(180, 180, 180))
            .label_font(("sans-serif", 14))
            .draw()
            .map_err(draw_err)?;

        // Panel 2: time per round, log scale.
        let secs = series
            .iter()
            .flat_map(|s| s.rounds.iter().map(|r| r.secs))
            .filter(|&t| t > 0.0);
        let (lo, hi) = secs.fold((f64::MAX, 0f64), |(lo, hi), t| (lo.min(t), hi.max(t)));
        let (lo, hi) = if hi > 0.0 {
            (lo / 2.0, hi * 2.0)
        } else {
            (1e-6, 1.0)
        };
        let mut chart = ChartBuilder::on(&panels[1])
            .caption(
                "Time in the engine per round (log scale)",
                ("sans-serif", 17),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range, (lo..hi).log_scale())
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .x_desc(spec.x_label.as_str())
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_desc("time per round")
            .y_label_formatter(&|v| duration_label(*v))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(draw_err)?;
        for (i, s) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(
                    thin(&s.rounds)
                        .into_iter()
                        .map(|r| (r.round as f64, r.secs.max(lo))),
                    color.stroke_width(2),
                ))
                .map_err(draw_err)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Renders the plot and writes it to `path`.
///
/// # Errors
/// [`PlotError`].
pub fn write_svg(path: &Path, spec: &PlotSpec, series: &[PlotSeries]) -> Result<(), PlotError> {
    let svg = render_svg(spec, series)?;
    std::fs::write(path, svg).map_err(|source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, n: u64, slow: f64) -> PlotSeries {
        PlotSeries {
            name: name.into(),
            rounds: (1..=n)
                .map(|i| RoundRecord {
                    round: i,
                    secs: 0.001 * slow * i as f64,
                    utilization: i as f64 / n as f64 * 0.99,
                    phase: None,
                })
                .collect(),
            failure: Some(0.99),
        }
    }

    #[test]
    fn one_line_per_engine_and_panel() {
        let spec = PlotSpec {
            title: "bench seed".into(),
            subtitle: "1GiB".into(),
            x_label: "round".into(),
        };
        let s = [series("segfit", 50, 1.0), series("bitmap", 40, 30.0)];
        let svg = render_svg(&spec, &s).unwrap();
        assert!(svg.starts_with("<svg"));
        for (i, _) in s.iter().enumerate() {
            let stroke = format!(
                "<polyline fill=\"none\" opacity=\"1\" stroke=\"{}\"",
                series_color(i)
            );
            assert_eq!(
                svg.matches(&stroke).count(),
                2,
                "one line per panel: {stroke}"
            );
        }
        assert!(svg.contains("segfit (first failure at 99.000%)"));
        assert!(svg.contains("bench seed"));
    }

    #[test]
    fn duration_labels() {
        assert_eq!(duration_label(0.00012), "120 µs");
        assert_eq!(duration_label(2.5), "2.5 s");
        assert_eq!(duration_label(0.004), "4.0 ms");
        assert_eq!(duration_label(3e-8), "30 ns");
    }

    #[test]
    fn long_runs_are_thinned_and_empty_runs_draw() {
        let s = series("x", 10_000, 1.0);
        assert!(thin(&s.rounds).len() <= MAX_POINTS + 1);
        assert_eq!(thin(&s.rounds).last().unwrap().round, 10_000);
        let empty = PlotSeries {
            name: "none".into(),
            rounds: Vec::new(),
            failure: None,
        };
        let svg = render_svg(&PlotSpec::default(), &[empty]).unwrap();
        assert!(svg.contains("none (no failure)"));
    }
}
