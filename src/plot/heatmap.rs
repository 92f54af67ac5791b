//! The attention-weights heatmap: the weights checked and cut into panels (one per head),
//! then drawn cell by cell with tick labels, axis names and a colour bar.

use std::path::Path;

use ndarray::{s, Array2, ArrayView2, ArrayViewD, Axis, Dimension, Ix3};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::colour::{bar_ticks, colour, ink};
use super::layout::{Layout, BAR_W};
use super::text::{self, text, Pen, AXIS_SIZE, PAD, PANEL_TITLE_SIZE};
use super::{render, DrawResult, Figure, Format, MAX_CELLS};
use crate::error::{Error, Result};

/// Draws attention weights as a heatmap, rows = queries, columns = keys, into `path`
/// (`.png` or `.svg`).
///
/// `weights` is laid out as [`crate::Attention`] returns it for `heads` heads: `(n, m)` or
/// `(batch, n, m)` for one head, `(H, n, m)` or `(batch, H, n, m)` for `H > 1` (a 4-D array
/// with `H = 1`, as a call on Q, K, V returns, works too). Each head gets a panel (four to a
/// row), titled `head 0`, `head 1`, …; of a batch, the first sequence is drawn and the title says
/// so. All panels share one colour scale, from 0 (or the smallest value, if negative) to
/// the largest, shown by a colour bar. `labels` (the tokens) name the rows and the columns;
/// without them, indices do. Cells carry their values up to 12 a side (9 with several heads);
/// larger matrices label every k-th row and column, and above [`MAX_CELLS`] a side are
/// drawn as means of square blocks.
///
/// # Errors
/// [`Error::InvalidArgument`] for a path not ending in `.png` or `.svg`;
/// [`Error::ShapeMismatch`] for a shape that does not fit `heads`, nothing to draw, or
/// labels of the wrong count; [`Error::NonFinite`] for NaN or infinity in `weights`;
/// [`Error::Io`] when the file cannot be written.
pub fn heatmap(
    path: &Path,
    weights: ArrayViewD<f32>,
    heads: usize,
    labels: Option<&[String]>,
    title: &str,
) -> Result<()> {
    let format = Format::from_path(path)?;
    let map = Heatmap::new(weights, heads, labels, title)?;
    render(path, format, &map)
}

/// What a heatmap shows, checked and laid out.
pub(super) struct Heatmap {
    pub title: String,
    /// One matrix per panel, all of one shape, with the panel's title ("" for none).
    pub panels: Vec<(String, Array2<f32>)>,
    /// The colour scale's ends.
    lo: f32,
    hi: f32,
    pub layout: Layout,
}

impl Heatmap {
    pub fn new(
        weights: ArrayViewD<f32>,
        heads: usize,
        labels: Option<&[String]>,
        title: &str,
    ) -> Result<Self> {
        let shape = weights.shape().to_vec();
        if heads == 0 {
            return Err(Error::invalid("heads", "must be at least 1"));
        }
        if let Some((index, &value)) = weights.indexed_iter().find(|(_, v)| !v.is_finite()) {
            return Err(Error::NonFinite {
                array: "weights".into(),
                value,
                index: index.slice().to_vec(),
            });
        }
        // To (panels, n, m): the first sequence of a batch, every head.
        let (stack, batch) = match (shape.len(), heads) {
            (2, 1) => (weights.insert_axis(Axis(0)), 1),
            (3, 1) => (weights.slice_axis(Axis(0), (0..1).into()), shape[0]),
            (3, h) if shape[0] == h => (weights, 1),
            (4, h) if shape[1] == h => (weights.index_axis(Axis(0), 0), shape[0]),
            _ => {
                return Err(Error::shape(format!(
                    "weights of shape {shape:?} with {heads} head(s): expected (n, m) or \
                     (batch, n, m) for one head, (H, n, m) or (batch, H, n, m) for H heads"
                )))
            }
        };
        let stack = stack
            .into_dimensionality::<Ix3>()
            .map_err(|e| Error::shape(e.to_string()))?;
        let (count, n, m) = stack.dim();
        if count == 0 || n == 0 || m == 0 {
            return Err(Error::shape(format!(
                "weights of shape {shape:?} have nothing to draw"
            )));
        }
        if let Some(l) = labels {
            if l.len() != n || l.len() != m {
                return Err(Error::shape(format!(
                    "{} labels for weights of {n} rows and {m} columns (labels name both)",
                    l.len()
                )));
            }
        }
        let f = n.max(m).div_ceil(MAX_CELLS);
        let panels: Vec<(String, Array2<f32>)> = stack
            .outer_iter()
            .enumerate()
            .map(|(h, w)| {
                let name = if count > 1 {
                    format!("head {h}")
                } else {
                    String::new()
                };
                (name, if f > 1 { pool(w, f) } else { w.to_owned() })
            })
            .collect();
        let mut title = title.to_string();
        if batch > 1 {
            title += &format!(" (sequence 0 of {batch})");
        }
        if f > 1 {
            title += &format!(" (means of {f}×{f} blocks)");
        }
        let values = || panels.iter().flat_map(|(_, p)| p.iter().copied());
        let lo = values().fold(0f32, f32::min);
        let hi = values().fold(f32::MIN, f32::max);
        let hi = if hi > lo { hi } else { lo + 1.0 };

        let layout = Layout::new(count, panels[0].1.dim(), f, labels, &title, (lo, hi))?;
        let title = text::fit(&text::title_style(), &title, layout.size.0 as i32 - 2 * PAD)?;
        Ok(Heatmap {
            title,
            panels,
            lo,
            hi,
            layout,
        })
    }

    /// Where `v` sits on the colour scale, 0 at `lo` and 1 at `hi`.
    pub fn scale(&self, v: f32) -> f64 {
        f64::from((v - self.lo) / (self.hi - self.lo))
    }

    /// Draws panel `p`: its title, its cells (with their values if they fit), the ticks
    /// and labels of its rows and columns, and the names of its axes.
    fn draw_panel<DB: DrawingBackend>(
        &self,
        pen: &Pen<DB>,
        p: usize,
        (name, m): &(String, Array2<f32>),
    ) -> DrawResult<DB> {
        let root = pen.root;
        let l = &self.layout;
        let cell = l.cell;
        let top_centre = Pos::new(HPos::Center, VPos::Top);
        let tick_right = text(l.tick_size, false, Pos::new(HPos::Right, VPos::Center));
        let tick_below = text(l.tick_size, false, top_centre);
        let tick_up = tick_right.transform(FontTransform::Rotate270);
        // Vertical text reading upwards: its top faces left, its bottom right.
        let axis_up_left = text(AXIS_SIZE, false, Pos::new(HPos::Center, VPos::Bottom))
            .transform(FontTransform::Rotate270);
        let value_size = (f64::from(cell) * 0.28).min(16.0);

        let (x0, y0) = l.corner(p);
        let (rows, cols) = m.dim();
        let (w, h) = (cell * cols as i32, cell * rows as i32);
        if !name.is_empty() {
            pen.write(
                name.clone(),
                (x0 + w / 2, y0 - 8),
                &text(PANEL_TITLE_SIZE, true, Pos::new(HPos::Center, VPos::Bottom)),
            )?;
        }
        for ((i, j), &v) in m.indexed_iter() {
            let (x, y) = (x0 + j as i32 * cell, y0 + i as i32 * cell);
            let c = colour(self.scale(v));
            root.draw(&Rectangle::new([(x, y), (x + cell, y + cell)], c.filled()))?;
            if l.annotate {
                let mut style = text(value_size, false, Pos::new(HPos::Center, VPos::Center));
                style.color = ink(c).to_backend_color();
                pen.write(format!("{v:.2}"), (x + cell / 2, y + cell / 2), &style)?;
            }
        }
        root.draw(&Rectangle::new([(x0, y0), (x0 + w, y0 + h)], BLACK))?;
        for (i, label) in &l.row_ticks {
            let y = y0 + *i as i32 * cell + cell / 2;
            root.draw(&PathElement::new(vec![(x0 - 4, y), (x0, y)], BLACK))?;
            pen.write(label.clone(), (x0 - 6, y), &tick_right)?;
        }
        for (j, label) in &l.col_ticks {
            let x = x0 + *j as i32 * cell + cell / 2;
            root.draw(&PathElement::new(vec![(x, y0 + h), (x, y0 + h + 4)], BLACK))?;
            let style = if l.rotate_cols { &tick_up } else { &tick_below };
            pen.write(label.clone(), (x, y0 + h + 6), style)?;
        }
        pen.write(
            "key",
            (x0 + w / 2, y0 + h + 6 + l.col_label_h + 8),
            &text(AXIS_SIZE, false, top_centre),
        )?;
        pen.write(
            "query",
            (x0 - 8 - l.row_label_w - 10, y0 + h / 2),
            &axis_up_left,
        )
    }

    /// Draws the colour bar beside the first row of panels, its ticks and its name.
    fn draw_colour_bar<DB: DrawingBackend>(&self, pen: &Pen<DB>) -> DrawResult<DB> {
        let root = pen.root;
        let l = &self.layout;
        let (bx, by) = l.bar_corner();
        let bh = l.bar_height();
        for k in 0..bh {
            let t = 1.0 - f64::from(k) / f64::from((bh - 1).max(1));
            root.draw(&Rectangle::new(
                [(bx, by + k), (bx + BAR_W, by + k + 1)],
                colour(t).filled(),
            ))?;
        }
        root.draw(&Rectangle::new([(bx, by), (bx + BAR_W, by + bh)], BLACK))?;
        let bar_tick = text(l.tick_size, false, Pos::new(HPos::Left, VPos::Center));
        for (q, (_, label)) in bar_ticks(self.lo, self.hi).into_iter().enumerate() {
            let y = by + bh - 1 - (f64::from(bh - 1) * q as f64 / 4.0).round() as i32;
            root.draw(&PathElement::new(
                vec![(bx + BAR_W, y), (bx + BAR_W + 4, y)],
                BLACK,
            ))?;
            pen.write(label, (bx + BAR_W + 6, y), &bar_tick)?;
        }
        // Vertical text reading upwards: its top faces left, its bottom right.
        let axis_up = text(AXIS_SIZE, false, Pos::new(HPos::Center, VPos::Top))
            .transform(FontTransform::Rotate270);
        pen.write(
            "attention weight",
            (bx + BAR_W + 6 + l.bar_label_w + 10, by + bh / 2),
            &axis_up,
        )
    }
}

impl Figure for Heatmap {
    fn size(&self) -> (u32, u32) {
        self.layout.size
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        nudge: f64,
    ) -> DrawResult<DB> {
        let pen = Pen { root, nudge };
        root.fill(&WHITE)?;
        pen.title(&self.title, self.layout.size.0)?;
        for (p, panel) in self.panels.iter().enumerate() {
            self.draw_panel(&pen, p, panel)?;
        }
        self.draw_colour_bar(&pen)
    }
}

/// Means of `f × f` blocks of `m` (the last blocks of a row or column may be smaller).
fn pool(m: ArrayView2<f32>, f: usize) -> Array2<f32> {
    let (rows, cols) = m.dim();
    Array2::from_shape_fn((rows.div_ceil(f), cols.div_ceil(f)), |(i, j)| {
        let block = m.slice(s![
            i * f..((i + 1) * f).min(rows),
            j * f..((j + 1) * f).min(cols)
        ]);
        block.mean().unwrap_or(0.0)
    })
}
