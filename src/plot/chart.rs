//! The throughput chart: GFLOP/s against the sequence length, one line per series, on
//! log–log axes, with a legend beside it.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::colour::LINE_COLOURS;
use super::text::{self, text, Pen, AXIS_SIZE, PAD, TITLE_SIZE};
use super::{render, DrawResult, Figure, Format};
use crate::error::{Error, Result};

/// One line of a throughput chart: GFLOP/s at each sequence length n.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The legend's name for it.
    pub name: String,
    /// (n, GFLOP/s) points.
    pub points: Vec<(usize, f64)>,
}

/// Draws GFLOP/s against n, one line per series, on log–log axes, into `path` (`.png` or
/// `.svg`), with `title` above and a legend. Points that cannot sit on a log axis (n = 0,
/// GFLOP/s not finite and positive) are left out.
///
/// # Errors
/// [`Error::InvalidArgument`] for a path not ending in `.png` or `.svg`, or no point to
/// draw; [`Error::Io`] when the file cannot be written.
pub fn throughput(path: &Path, title: &str, series: &[Series]) -> Result<()> {
    let format = Format::from_path(path)?;
    let chart = Throughput::new(title, series)?;
    render(path, format, &chart)
}

/// Size of a throughput chart's plot area and axes.
pub(super) const CHART_SIZE: (u32, u32) = (760, 560);

/// A throughput chart's lines, axis ranges and legend.
struct Throughput<'a> {
    title: String,
    lines: Vec<(&'a str, Vec<(f64, f64)>)>,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    /// The lengths measured, ticked on the x axis.
    ns: Vec<f64>,
    legend: TextStyle<'static>,
    /// Width of the legend, right of the chart.
    legend_w: i32,
}

impl<'a> Throughput<'a> {
    fn new(title: &str, series: &'a [Series]) -> Result<Self> {
        let lines: Vec<(&str, Vec<(f64, f64)>)> = series
            .iter()
            .map(|s| {
                let points = s
                    .points
                    .iter()
                    .filter(|(n, g)| *n > 0 && g.is_finite() && *g > 0.0)
                    .map(|&(n, g)| (n as f64, g))
                    .collect::<Vec<_>>();
                (s.name.as_str(), points)
            })
            .filter(|(_, p)| !p.is_empty())
            .collect();
        let all = || lines.iter().flat_map(|(_, p)| p.iter());
        let (Some(n_lo), Some(g_lo)) = (
            all().map(|p| p.0).reduce(f64::min),
            all().map(|p| p.1).reduce(f64::min),
        ) else {
            return Err(Error::invalid(
                "throughput chart",
                "no point with n > 0 and a positive, finite GFLOP/s",
            ));
        };
        let n_hi = all().map(|p| p.0).fold(n_lo, f64::max);
        let g_hi = all().map(|p| p.1).fold(g_lo, f64::max);
        // Ticks at the measured lengths.
        let mut ns: Vec<f64> = all().map(|p| p.0).collect();
        ns.sort_by(f64::total_cmp);
        ns.dedup();
        text::fonts()?;
        let legend = text(14.0, false, Pos::new(HPos::Left, VPos::Center));
        let legend_w = text::widest(&legend, lines.iter().map(|(name, _)| *name))? + 60;
        let title = text::fit(
            &text::title_style(),
            title,
            CHART_SIZE.0 as i32 + legend_w - 2 * PAD,
        )?;
        Ok(Throughput {
            title,
            lines,
            x: (n_lo / 1.5)..(n_hi * 1.5),
            y: (g_lo / 2.0)..(g_hi * 2.0),
            ns,
            legend,
            legend_w,
        })
    }
}

impl Figure for Throughput<'_> {
    fn size(&self) -> (u32, u32) {
        (CHART_SIZE.0 + self.legend_w as u32, CHART_SIZE.1)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        nudge: f64,
    ) -> DrawResult<DB> {
        root.fill(&WHITE)?;
        Pen { root, nudge }.title(&self.title, self.size().0)?;
        let (left, right) = root.split_horizontally(CHART_SIZE.0);
        let mut chart = ChartBuilder::on(&left)
            .margin(20)
            .margin_top(PAD + TITLE_SIZE as i32 + 24)
            .x_label_area_size(56)
            .y_label_area_size(80)
            .build_cartesian_2d(
                self.x.clone().log_scale().with_key_points(self.ns.clone()),
                self.y.clone().log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc("sequence length n")
            .y_desc("GFLOP/s")
            .label_style(text(14.0, false, Pos::default()))
            .axis_desc_style(text(AXIS_SIZE, false, Pos::default()))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format_gflops(*v))
            .draw()?;
        // The legend beside the chart, level with the top of its plot area.
        let pen = Pen {
            root: &right,
            nudge,
        };
        let top = chart.plotting_area().get_pixel_range().1.start + 10;
        for (i, (name, points)) in self.lines.iter().enumerate() {
            let c = LINE_COLOURS[i % LINE_COLOURS.len()];
            let style = c.stroke_width(2);
            chart.draw_series(LineSeries::new(points.iter().copied(), style))?;
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
            let y = top + 24 * i as i32;
            right.draw(&PathElement::new(vec![(4, y), (32, y)], style))?;
            right.draw(&Circle::new((18, y), 4, c.filled()))?;
            pen.write(*name, (40, y), &self.legend)?;
        }
        Ok(())
    }
}

/// A GFLOP/s tick label: three significant digits at most, no trailing zeros.
pub(super) fn format_gflops(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        let decimals = (2.0 - v.log10().floor()).clamp(0.0, 6.0) as usize;
        let s = format!("{v:.decimals$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}
