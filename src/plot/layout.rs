//! Where a heatmap's parts go: the size of a cell, which rows and columns get a label, the
//! grid of panels, the colour bar, and the figure's size.

use plotters::style::text_anchor::Pos;

use super::colour::bar_ticks;
use super::text::{self, measure, text, AXIS_SIZE, PAD, PANEL_TITLE_SIZE};
use crate::error::Result;

/// Width of the colour bar.
pub(super) const BAR_W: i32 = 20;

/// Pixel geometry of a heatmap figure.
pub(super) struct Layout {
    pub size: (u32, u32),
    /// Side of a cell.
    pub cell: i32,
    /// Panels per row of the grid.
    pub grid_cols: usize,
    /// Top-left corner of panel 0's matrix, and the step to the next panel right and down.
    pub origin: (i32, i32),
    pub step: (i32, i32),
    /// Cells per panel, down and across.
    pub cells: (usize, usize),
    pub tick_size: f64,
    /// (row or column drawn, its label), for the rows and the columns.
    pub row_ticks: Vec<(usize, String)>,
    pub col_ticks: Vec<(usize, String)>,
    /// Column labels drawn vertically (they do not fit across their columns).
    pub rotate_cols: bool,
    /// Widest row label and deepest column label area.
    pub row_label_w: i32,
    pub col_label_h: i32,
    /// Widest colour-bar label.
    pub bar_label_w: i32,
    /// Values written in the cells.
    pub annotate: bool,
}

impl Layout {
    /// Lays out `count` panels of `rows × cols` cells, each cell the mean of a `block × block`
    /// block of the weights, whose rows and columns `labels` name (indices without them),
    /// under `title`, with a colour bar from `lo` to `hi`.
    pub fn new(
        count: usize,
        (rows, cols): (usize, usize),
        block: usize,
        labels: Option<&[String]>,
        title: &str,
        (lo, hi): (f32, f32),
    ) -> Result<Layout> {
        text::fonts()?;
        // Panels about 480 pixels a side alone, 360 side by side.
        let target = if count > 1 { 360 } else { 480 };
        let cell = (target / rows.max(cols)).clamp(2, 64) as i32;
        let tick_size = (f64::from(cell) * 0.45).clamp(12.0, 18.0);
        let tick_style = text(tick_size, false, Pos::default());
        let (_, tick_h) = measure(&tick_style, "0")?;
        // Label every k-th row or column, k so the labels do not overlap.
        let stride = nice_stride(f64::from(tick_h) * 1.4 / f64::from(cell));
        let ticks = |count: usize| -> Vec<(usize, String)> {
            (0..count)
                .step_by(stride)
                .map(|i| {
                    let first = i * block;
                    let label = labels.map_or_else(|| first.to_string(), |l| l[first].clone());
                    (i, label)
                })
                .collect()
        };
        let (row_ticks, col_ticks) = (ticks(rows), ticks(cols));
        let labels_w = |ticks: &[(usize, String)]| {
            text::widest(&tick_style, ticks.iter().map(|(_, t)| t.as_str()))
        };
        let row_label_w = labels_w(&row_ticks)?;
        let col_w = labels_w(&col_ticks)?;
        let rotate_cols = col_w + 6 > cell * stride as i32;
        let col_label_h = if rotate_cols { col_w } else { tick_h };
        let (_, axis_h) = measure(&text(AXIS_SIZE, false, Pos::default()), "query")?;
        let panel_title_h = if count > 1 {
            measure(&text(PANEL_TITLE_SIZE, true, Pos::default()), "head")?.1 + 12
        } else {
            4
        };
        let (_, title_h) = measure(&text::title_style(), title)?;
        let grid_cols = count.min(4);
        let grid_rows = count.div_ceil(grid_cols);
        let left = axis_h + 10 + row_label_w + 8;
        let step = (
            left + cell * cols as i32 + 24,
            panel_title_h + cell * rows as i32 + 8 + col_label_h + 8 + axis_h + 16,
        );
        let origin = (PAD + left, PAD + title_h + 16 + panel_title_h);
        let bar_ticks = bar_ticks(lo, hi);
        let bar_label_w = text::widest(&tick_style, bar_ticks.iter().map(|(_, l)| l.as_str()))?;
        let bar_area = BAR_W + 6 + bar_label_w + 10 + axis_h;
        let width = PAD + grid_cols as i32 * step.0 + bar_area + PAD;
        let height = origin.1 - panel_title_h + grid_rows as i32 * step.1 - 16 + PAD;
        Ok(Layout {
            size: (width as u32, height as u32),
            cell,
            grid_cols,
            origin,
            step,
            cells: (rows, cols),
            tick_size,
            row_ticks,
            col_ticks,
            rotate_cols,
            row_label_w,
            col_label_h,
            bar_label_w,
            annotate: cell >= 40,
        })
    }

    /// Top-left corner of panel `p`'s matrix.
    pub fn corner(&self, p: usize) -> (i32, i32) {
        let (r, c) = ((p / self.grid_cols) as i32, (p % self.grid_cols) as i32);
        (
            self.origin.0 + c * self.step.0,
            self.origin.1 + r * self.step.1,
        )
    }

    /// Top-left corner of the colour bar: right of the first row of panels, level with
    /// their tops.
    pub fn bar_corner(&self) -> (i32, i32) {
        let last = self.corner(self.grid_cols - 1).0;
        (last + self.cell * self.cells.1 as i32 + 24, self.origin.1)
    }

    /// Height of the colour bar: that of a panel.
    pub fn bar_height(&self) -> i32 {
        self.cell * self.cells.0 as i32
    }
}

/// The smallest of 1, 2, 5, 10, 20, 50, … that is at least `x`.
pub(super) fn nice_stride(x: f64) -> usize {
    let mut scale = 1;
    loop {
        for step in [1, 2, 5] {
            if (step * scale) as f64 >= x {
                return step * scale;
            }
        }
        scale *= 10;
    }
}
