//! `--plot FILE.svg` for `bench` and `replay`: the runs' reports drawn by
//! `blockalloc_bench::render_svg`.

use std::path::Path;

use anyhow::Context;
use blockalloc_bench::{write_svg, PlotSeries, PlotSpec, RunReport};

/// Writes the plot of `reports` to `path`.
///
/// # Errors
/// The file cannot be written.
pub fn write(
    path: &Path,
    title: String,
    subtitle: String,
    x_label: String,
    reports: &[&RunReport],
) -> anyhow::Result<()> {
    let series: Vec<PlotSeries> = reports.iter().map(|r| PlotSeries::from(*r)).collect();
    let spec = PlotSpec {
        title,
        subtitle,
        x_label,
    };
    write_svg(path, &spec, &series).with_context(|| format!("--plot {}", path.display()))
}
