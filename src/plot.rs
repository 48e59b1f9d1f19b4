//! Loss curves as SVG, drawn with plotters.

use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Drawing a plot failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {}: {message}", path.display())]
pub struct PlotError {
    /// The file being drawn.
    pub path: PathBuf,
    /// What plotters said.
    pub message: String,
}

impl PlotError {
    fn new(path: &Path, error: impl std::fmt::Display) -> PlotError {
        PlotError {
            path: path.to_owned(),
            message: error.to_string(),
        }
    }
}

/// Draws one loss per training step, coloured by the phase it belongs to (in order of first
/// appearance), with a moving average over 20 steps on top.
pub fn loss_curve(path: &Path, losses: &[(f64, &str)]) -> Result<(), PlotError> {
    let finite = losses.iter().map(|(l, _)| *l).filter(|l| l.is_finite());
    let top = finite.fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| PlotError::new(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("digits MLP: training loss per step", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0..losses.len().max(1), 0.0..top)
        .map_err(|e| PlotError::new(path, e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("cross-entropy")
        .draw()
        .map_err(|e| PlotError::new(path, e))?;
    let mut phases: Vec<&str> = Vec::new();
    for (_, phase) in losses {
        if !phases.contains(phase) {
            phases.push(phase);
        }
    }
    for (i, phase) in phases.iter().enumerate() {
        let color = Palette99::pick(i);
        let points: Vec<(usize, f64)> = (losses.iter().enumerate())
            .filter(|(_, (l, p))| p == phase && l.is_finite())
            .map(|(step, (l, _))| (step, *l))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.mix(0.3)))
            .map_err(|e| PlotError::new(path, e))?;
        let averaged: Vec<(usize, f64)> = (0..points.len())
            .map(|j| {
                let window = &points[j.saturating_sub(19)..=j];
                let mean = window.iter().map(|(_, l)| l).sum::<f64>() / window.len() as f64;
                (points[j].0, mean)
            })
            .collect();
        chart
            .draw_series(LineSeries::new(averaged, color.stroke_width(2)))
            .map_err(|e| PlotError::new(path, e))?
            .label(*phase)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| PlotError::new(path, e))?;
    root.present().map_err(|e| PlotError::new(path, e))
}
