//! The SVG chart: messages per second against consumers, one line per variant, one
//! panel per backend. Text is left to the SVG viewer's fonts, so no font library is
//! needed to draw it.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;

use crate::bench::BackendRun;
use crate::cli::Plan;

const WIDTH: u32 = 1100;
const PANEL_HEIGHT: u32 = 520;
/// Pixels between the legend's lines: room for twenty variants in a panel.
const LEGEND_STEP: i32 = 22;
/// The share of a panel's width given to the plot; the legend takes the rest.
const PLOT_SHARE: f64 = 0.66;

pub fn draw(path: &Path, plan: &Plan, runs: &[BackendRun]) -> anyhow::Result<()> {
    let height = PANEL_HEIGHT * runs.len().max(1) as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    for (panel, run) in root.split_evenly((runs.len().max(1), 1)).iter().zip(runs) {
        draw_panel(panel, plan, run)?;
    }
    root.present()
        .with_context(|| format!("write {}", path.display()))?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    panel: &DrawingArea<DB, plotters::coord::Shift>,
    plan: &Plan,
    run: &BackendRun,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let (plot, legend) = panel.split_horizontally((WIDTH as f64 * PLOT_SHARE) as i32);
    let rates: Vec<f64> = run.measurements.iter().map(|m| m.per_second()).collect();
    let low = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let high = rates.iter().copied().fold(0.0, f64::max);
    // plotters subdivides only whole decades, so the axis starts at a power of ten.
    let floor = 10f64.powf((low * 0.8).log10().floor());
    // Consumer counts sit at evenly spaced positions 0, 1, 2, … labelled with the count,
    // so 1, 4, 8 and 16 stay readable.
    let last = (plan.consumers.len() - 1) as f64;

    let mut chart = ChartBuilder::on(&plot)
        .caption(
            format!("{}: messages per second", run.backend.name()),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        // Logarithmic: all-duplicate deliveries run an order of magnitude faster than
        // the rest, which a linear axis would flatten into one line.
        .build_cartesian_2d(-0.3..last + 0.3, (floor..high * 1.25).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("concurrent consumers")
        .y_desc("messages per second (log scale)")
        .x_labels(plan.consumers.len())
        .x_label_formatter(&|position| {
            let index = position.round();
            let count = plan.consumers.get(index as usize);
            match count {
                Some(count) if (position - index).abs() < 1e-6 => count.to_string(),
                _ => String::new(),
            }
        })
        .y_labels(30)
        .y_label_formatter(&log_label)
        .light_line_style(WHITE)
        .draw()?;

    for (index, &variant) in plan.variants().iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let points: Vec<(f64, f64)> = plan
            .consumers
            .iter()
            .enumerate()
            .filter_map(|(position, &consumers)| {
                run.find(variant, consumers)
                    .map(|m| (position as f64, m.per_second()))
            })
            .collect();
        chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
        chart.draw_series(
            points
                .iter()
                .map(|&point| Circle::new(point, 3, color.filled())),
        )?;

        // The legend sits beside the plot, where it cannot hide a line.
        let y = 60 + LEGEND_STEP * index as i32;
        legend.draw(&PathElement::new(
            vec![(10, y), (40, y)],
            color.stroke_width(3),
        ))?;
        legend.draw(&Text::new(
            variant.label(),
            (48, y - 7),
            ("sans-serif", 14).into_font(),
        ))?;
    }
    Ok(())
}

/// Labels 1, 2 and 5 times each power of ten and leaves the other key points bare, so
/// the labels of a log axis do not crowd each other.
fn log_label(y: &f64) -> String {
    let decade = 10f64.powf(y.log10().floor());
    let leading = y / decade;
    let near = |step: f64| (leading - step).abs() < 1e-6;
    if near(1.0) || near(2.0) || near(5.0) {
        format!("{y:.0}")
    } else {
        String::new()
    }
}
