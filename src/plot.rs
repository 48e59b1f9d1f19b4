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
pub fn loss_curve(path: &Path, title: &str, losses: &[(f64, &str)]) -> Result<(), PlotError> {
    let finite = losses.iter().map(|(l, _)| *l).filter(|l| l.is_finite());
    let top = finite.fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| PlotError::new(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
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

/// Draws a training history: loss per epoch (left) and accuracy per epoch (right), for the
/// training batches and, when measured, the validation set.
pub fn history(path: &Path, history: &crate::train::History) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError::new(path, e);
    let root = SVGBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((1, 2));
    let epochs = &history.epochs;
    type Pick = fn(&crate::train::Metrics) -> f64;
    let charts: [(&str, &str, Pick); 2] = [
        ("loss per epoch", "cross-entropy", |m| m.loss),
        ("accuracy per epoch", "accuracy (%)", |m| 100.0 * m.accuracy),
    ];
    for (panel, (caption, y_desc, pick)) in panels.iter().zip(charts) {
        let series: [(&str, Vec<(usize, f64)>); 2] = [
            (
                "training",
                (epochs.iter())
                    .map(|e| (e.epoch + 1, pick(&e.train)))
                    .collect(),
            ),
            (
                "validation",
                (epochs.iter())
                    .filter_map(|e| e.validation.as_ref().map(|m| (e.epoch + 1, pick(m))))
                    .collect(),
            ),
        ];
        let values = series.iter().flat_map(|(_, s)| s.iter().map(|p| p.1));
        let finite: Vec<f64> = values.filter(|v| v.is_finite()).collect();
        let (min, max) = (finite.iter()).fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
        let margin = 0.1 * (max - min).max(1e-3);
        let (low, high) = ((min - margin).max(0.0), max + margin);
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d(1..epochs.len().max(2), low..high)
            .map_err(|e| err(&e))?;
        (chart.configure_mesh().x_desc("epoch").y_desc(y_desc).draw()).map_err(|e| err(&e))?;
        for (i, (name, points)) in series.into_iter().enumerate() {
            if points.is_empty() {
                continue;
            }
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| err(&e))?;
        }
        (chart.configure_series_labels())
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// Draws a confusion matrix: a cell per (true, predicted) class, darker for more examples,
/// with its count, and each class's accuracy beside its row.
pub fn confusion_matrix(
    path: &Path,
    matrix: &crate::train::ConfusionMatrix,
    class_names: &[String],
) -> Result<(), PlotError> {
    let err = |e: &dyn std::fmt::Display| PlotError::new(path, e);
    let n = matrix.counts.len().max(1) as i32;
    let (cell, left, top) = (44, 110, 70);
    let size = ((left + cell * n + 90) as u32, (top + cell * n + 40) as u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let title = "confusion matrix (rows: true class, columns: predicted)";
    root.draw(&Text::new(title, (10, 10), ("sans-serif", 18)))
        .map_err(|e| err(&e))?;
    let largest = matrix
        .counts
        .iter()
        .flatten()
        .copied()
        .max()
        .unwrap_or(1)
        .max(1);
    let recall = matrix.per_class_accuracy();
    let name = |i: usize| class_names.get(i).cloned().unwrap_or_else(|| i.to_string());
    let small = ("sans-serif", 12).into_font();
    for (t, row) in matrix.counts.iter().enumerate() {
        let y = top + cell * t as i32;
        root.draw(&Text::new(name(t), (8, y + cell / 3), small.clone()))
            .map_err(|e| err(&e))?;
        let accuracy = format!("{:.0} %", 100.0 * recall[t]);
        let right = (left + cell * n + 8, y + cell / 3);
        root.draw(&Text::new(accuracy, right, small.clone()))
            .map_err(|e| err(&e))?;
        for (p, &count) in row.iter().enumerate() {
            let x = left + cell * p as i32;
            let shade = 1.0 - count as f64 / largest as f64;
            let level = (255.0 * shade) as u8;
            let fill = RGBColor(level, level, 255);
            root.draw(&Rectangle::new(
                [(x, y), (x + cell, y + cell)],
                fill.filled(),
            ))
            .map_err(|e| err(&e))?;
            let ink = if shade < 0.5 { WHITE } else { BLACK };
            let text = Text::new(
                count.to_string(),
                (x + 4, y + cell / 3),
                small.clone().color(&ink),
            );
            root.draw(&text).map_err(|e| err(&e))?;
        }
    }
    for p in 0..n as usize {
        let label: String = name(p).chars().take(6).collect();
        let at = (left + cell * p as i32 + 2, top - 16);
        root.draw(&Text::new(label, at, small.clone()))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}
