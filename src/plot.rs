//! Pictures of the results: the attention weights as a labelled heatmap ([`heatmap`]) and
//! throughput against the sequence length as a line chart ([`throughput`]), as PNG or SVG
//! (chosen by the file's extension), drawn with `plotters`.
//!
//! Text is drawn with DejaVu Sans, embedded in the binary (the `dejavu` crate), through
//! plotters' `ab_glyph` font backend: no system font, fontconfig or freetype is needed, so
//! the pictures look the same on every machine. SVG files name the family `sans-serif`.

use std::path::Path;
use std::sync::OnceLock;

use ndarray::{s, Array2, ArrayView2, ArrayViewD, Axis, Dimension, Ix3};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::{Error, Result};

/// The image formats, chosen by a file's extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.png`: a bitmap.
    Png,
    /// `.svg`: vector graphics, text kept as text.
    Svg,
}

impl Format {
    /// The format `path`'s extension names (`png` or `svg`, in any case).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other extension, or none.
    pub fn from_path(path: &Path) -> Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("png") => Ok(Format::Png),
            Some("svg") => Ok(Format::Svg),
            _ => Err(Error::invalid(
                "plot file",
                format!("{}: the name must end in .png or .svg", path.display()),
            )),
        }
    }
}

/// Matrices larger than this on a side are drawn as means of square blocks, so a picture
/// (and an SVG's element count) stays bounded.
pub const MAX_CELLS: usize = 128;

/// Registers the embedded DejaVu Sans as plotters' `sans-serif`, once per process.
fn fonts() -> Result<()> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = *LOADED.get_or_init(|| {
        let sans = FontFamily::SansSerif.as_str();
        plotters::style::register_font(sans, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(sans, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if loaded {
        Ok(())
    } else {
        Err(Error::invalid(
            "font",
            "the embedded DejaVu Sans could not be loaded",
        ))
    }
}

/// A text style in the embedded font: black, anchored at `pos`.
fn text(size: f64, bold: bool, pos: Pos) -> TextStyle<'static> {
    let style = if bold {
        FontStyle::Bold
    } else {
        FontStyle::Normal
    };
    TextStyle {
        font: FontDesc::new(FontFamily::SansSerif, size, style),
        color: BLACK.to_backend_color(),
        pos,
    }
}

/// `text`'s width and height in `style`, in pixels (unrotated).
fn measure(style: &TextStyle, text: &str) -> Result<(i32, i32)> {
    let ((x0, y0), (x1, y1)) = style
        .font
        .layout_box(text)
        .map_err(|e| Error::invalid("font", e.to_string()))?;
    Ok((x1 - x0, y1 - y0))
}

/// `title`, cut short with "…" if it is wider than `width` in `style` (a long sentence, a
/// long adapter name).
fn fit(style: &TextStyle, title: &str, width: i32) -> Result<String> {
    let mut chars: Vec<char> = title.chars().collect();
    let mut fitted = title.to_string();
    while measure(style, &fitted)?.0 > width && chars.len() > 1 {
        chars.pop();
        fitted = chars.iter().collect::<String>().trim_end().to_string() + "…";
    }
    Ok(fitted)
}

/// A picture that can be drawn on any plotters backend.
trait Figure {
    /// Its size in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws it on `root`, text that it places itself moved down by `nudge` times its size
    /// (see [`Pen`]).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, nudge: f64)
        -> DrawResult<DB>;
}

/// How far plotters' `ab_glyph` text sits above where an SVG viewer puts it, in font sizes:
/// it sets the baseline half a size below the top of a text box 1/1.24 of a size tall.
const BITMAP_NUDGE: f64 = 0.2;

/// Writes text on a drawing area, moved `nudge` times its size down along the text's own
/// vertical, so that anchored text sits where it is anchored on every backend.
struct Pen<'a, DB: DrawingBackend> {
    root: &'a DrawingArea<DB, Shift>,
    nudge: f64,
}

impl<DB: DrawingBackend> Pen<'_, DB> {
    fn write(&self, s: impl Into<String>, (x, y): (i32, i32), style: &TextStyle) -> DrawResult<DB> {
        let d = (style.font.get_size() * self.nudge).round() as i32;
        let at = match style.font.get_transform() {
            FontTransform::Rotate90 => (x - d, y),
            FontTransform::Rotate180 => (x, y - d),
            FontTransform::Rotate270 => (x + d, y),
            _ => (x, y + d),
        };
        self.root.draw(&Text::new(s.into(), at, style.clone()))
    }
}

/// Draws `figure` with the backend `path`'s extension names and writes the file.
fn render(path: &Path, figure: &impl Figure) -> Result<()> {
    let failed = |e: &dyn std::fmt::Display| Error::io(path, format!("cannot draw the plot: {e}"));
    match Format::from_path(path)? {
        Format::Png => {
            let root = BitMapBackend::new(path, figure.size()).into_drawing_area();
            figure.draw(&root, BITMAP_NUDGE).map_err(|e| failed(&e))?;
            root.present().map_err(|e| failed(&e))
        }
        Format::Svg => {
            let root = SVGBackend::new(path, figure.size()).into_drawing_area();
            figure.draw(&root, 0.0).map_err(|e| failed(&e))?;
            root.present().map_err(|e| failed(&e))
        }
    }
}

type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

// ---------------------------------------------------------------------------------------
// Heatmaps

/// The colour of `t` in [0, 1] on a viridis-like scale (dark blue-violet to yellow),
/// interpolated between five anchors.
fn colour(t: f64) -> RGBColor {
    const ANCHORS: [(f64, f64, f64); 5] = [
        (68.0, 1.0, 84.0),
        (59.0, 82.0, 139.0),
        (33.0, 145.0, 140.0),
        (94.0, 201.0, 98.0),
        (253.0, 231.0, 37.0),
    ];
    let t = if t.is_finite() {
        t.clamp(0.0, 1.0)
    } else {
        0.0
    } * 4.0;
    let i = (t.floor() as usize).min(3);
    let f = t - i as f64;
    let (a, b) = (ANCHORS[i], ANCHORS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Black or white, whichever reads better on `c`.
fn ink(c: RGBColor) -> RGBColor {
    let luma = 0.299 * f64::from(c.0) + 0.587 * f64::from(c.1) + 0.114 * f64::from(c.2);
    if luma > 140.0 {
        BLACK
    } else {
        WHITE
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

/// The smallest of 1, 2, 5, 10, 20, 50, … that is at least `x`.
fn nice_stride(x: f64) -> usize {
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

/// What a heatmap shows, checked and laid out.
struct Heatmap {
    title: String,
    /// One matrix per panel, all of one shape, with the panel's title ("" for none).
    panels: Vec<(String, Array2<f32>)>,
    /// (row or column drawn, its label), for the rows and the columns.
    row_ticks: Vec<(usize, String)>,
    col_ticks: Vec<(usize, String)>,
    /// The colour scale's ends.
    lo: f32,
    hi: f32,
    layout: Layout,
}

/// Pixel geometry of a heatmap figure.
struct Layout {
    size: (u32, u32),
    /// Side of a cell.
    cell: i32,
    /// Panels per row of the grid.
    grid_cols: usize,
    /// Top-left corner of panel 0's matrix, and the step to the next panel right and down.
    origin: (i32, i32),
    step: (i32, i32),
    tick_size: f64,
    /// Column labels drawn vertically (they do not fit across their columns).
    rotate_cols: bool,
    /// Widest row label and deepest column label area.
    row_label_w: i32,
    col_label_h: i32,
    /// Values written in the cells.
    annotate: bool,
}

const PAD: i32 = 16;
const TITLE_SIZE: f64 = 22.0;
const PANEL_TITLE_SIZE: f64 = 18.0;
const AXIS_SIZE: f64 = 16.0;
const BAR_W: i32 = 20;

impl Heatmap {
    fn new(
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
        let lo = panels
            .iter()
            .flat_map(|(_, p)| p.iter())
            .fold(0f32, |a, &b| a.min(b));
        let hi = panels
            .iter()
            .flat_map(|(_, p)| p.iter())
            .fold(f32::MIN, |a, &b| a.max(b));
        let hi = if hi > lo { hi } else { lo + 1.0 };

        fonts()?;
        let (rows, cols) = panels[0].1.dim();
        // Panels about 480 pixels a side alone, 360 side by side.
        let target = if count > 1 { 360 } else { 480 };
        let cell = (target / rows.max(cols)).clamp(2, 64) as i32;
        let tick_size = (f64::from(cell) * 0.45).clamp(12.0, 18.0);
        let tick_style = text(tick_size, false, Pos::default());
        let (_, tick_h) = measure(&tick_style, "0")?;
        // Label every k-th row or column, k so the labels do not overlap.
        let stride = nice_stride(f64::from(tick_h) * 1.4 / f64::from(cell));
        let label = |i: usize| {
            let first = i * f;
            match labels {
                Some(l) => l[first].clone(),
                None => first.to_string(),
            }
        };
        let row_ticks: Vec<(usize, String)> =
            (0..rows).step_by(stride).map(|i| (i, label(i))).collect();
        let col_ticks: Vec<(usize, String)> =
            (0..cols).step_by(stride).map(|j| (j, label(j))).collect();
        let widest = |ticks: &[(usize, String)]| -> Result<i32> {
            ticks
                .iter()
                .try_fold(0, |w, (_, t)| Ok(w.max(measure(&tick_style, t)?.0)))
        };
        let row_label_w = widest(&row_ticks)?;
        let col_w = widest(&col_ticks)?;
        let rotate_cols = col_w + 6 > cell * stride as i32;
        let col_label_h = if rotate_cols { col_w } else { tick_h };
        let (_, axis_h) = measure(&text(AXIS_SIZE, false, Pos::default()), "query")?;
        let panel_title_h = if count > 1 {
            measure(&text(PANEL_TITLE_SIZE, true, Pos::default()), "head")?.1 + 12
        } else {
            4
        };
        let title_style = text(TITLE_SIZE, true, Pos::default());
        let (_, title_h) = measure(&title_style, &title)?;
        let grid_cols = count.min(4);
        let grid_rows = count.div_ceil(grid_cols);
        let left = axis_h + 10 + row_label_w + 8;
        let step = (
            left + cell * cols as i32 + 24,
            panel_title_h + cell * rows as i32 + 8 + col_label_h + 8 + axis_h + 16,
        );
        let origin = (PAD + left, PAD + title_h + 16 + panel_title_h);
        let bar_labels = (0..5).try_fold(0, |w, q| {
            let v = lo + (hi - lo) * q as f32 / 4.0;
            Ok::<_, Error>(w.max(measure(&tick_style, &bar_label(v, lo, hi))?.0))
        })?;
        let bar_area = BAR_W + 6 + bar_labels + 10 + axis_h;
        let width = PAD + grid_cols as i32 * step.0 + bar_area + PAD;
        let title = fit(&title_style, &title, width - 2 * PAD)?;
        let height = origin.1 - panel_title_h + grid_rows as i32 * step.1 - 16 + PAD;
        let layout = Layout {
            size: (width as u32, height as u32),
            cell,
            grid_cols,
            origin,
            step,
            tick_size,
            rotate_cols,
            row_label_w,
            col_label_h,
            annotate: cell >= 40,
        };
        Ok(Heatmap {
            title,
            panels,
            row_ticks,
            col_ticks,
            lo,
            hi,
            layout,
        })
    }

    /// Top-left corner of panel `p`'s matrix.
    fn corner(&self, p: usize) -> (i32, i32) {
        let l = &self.layout;
        let (r, c) = ((p / l.grid_cols) as i32, (p % l.grid_cols) as i32);
        (l.origin.0 + c * l.step.0, l.origin.1 + r * l.step.1)
    }

    fn scale(&self, v: f32) -> f64 {
        f64::from((v - self.lo) / (self.hi - self.lo))
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
        let l = &self.layout;
        let cell = l.cell;
        root.fill(&WHITE)?;
        let top_centre = Pos::new(HPos::Center, VPos::Top);
        pen.write(
            self.title.clone(),
            (l.size.0 as i32 / 2, PAD),
            &text(TITLE_SIZE, true, top_centre),
        )?;
        let tick_right = text(l.tick_size, false, Pos::new(HPos::Right, VPos::Center));
        let tick_below = text(l.tick_size, false, top_centre);
        let tick_up = tick_right.transform(FontTransform::Rotate270);
        let axis_below = text(AXIS_SIZE, false, top_centre);
        // Vertical text reading upwards: its top faces left, its bottom right.
        let axis_up = text(AXIS_SIZE, false, Pos::new(HPos::Center, VPos::Top))
            .transform(FontTransform::Rotate270);
        let axis_up_left = axis_up.pos(Pos::new(HPos::Center, VPos::Bottom));
        let value_size = (f64::from(cell) * 0.28).min(16.0);
        for (p, (name, m)) in self.panels.iter().enumerate() {
            let (x0, y0) = self.corner(p);
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
            for (i, label) in &self.row_ticks {
                let y = y0 + *i as i32 * cell + cell / 2;
                root.draw(&PathElement::new(vec![(x0 - 4, y), (x0, y)], BLACK))?;
                pen.write(label.clone(), (x0 - 6, y), &tick_right)?;
            }
            for (j, label) in &self.col_ticks {
                let x = x0 + *j as i32 * cell + cell / 2;
                root.draw(&PathElement::new(vec![(x, y0 + h), (x, y0 + h + 4)], BLACK))?;
                let style = if l.rotate_cols { &tick_up } else { &tick_below };
                pen.write(label.clone(), (x, y0 + h + 6), style)?;
            }
            pen.write(
                "key",
                (x0 + w / 2, y0 + h + 6 + l.col_label_h + 8),
                &axis_below,
            )?;
            pen.write(
                "query",
                (x0 - 8 - l.row_label_w - 10, y0 + h / 2),
                &axis_up_left,
            )?;
        }
        // The colour bar, beside the first row of panels.
        let (rows, cols) = self.panels[0].1.dim();
        let bx = self.corner(0).0 + (l.grid_cols as i32 - 1) * l.step.0 + cell * cols as i32 + 24;
        let by = l.origin.1;
        let bh = cell * rows as i32;
        for k in 0..bh {
            let t = 1.0 - f64::from(k) / f64::from((bh - 1).max(1));
            root.draw(&Rectangle::new(
                [(bx, by + k), (bx + BAR_W, by + k + 1)],
                colour(t).filled(),
            ))?;
        }
        root.draw(&Rectangle::new([(bx, by), (bx + BAR_W, by + bh)], BLACK))?;
        let bar_tick = text(l.tick_size, false, Pos::new(HPos::Left, VPos::Center));
        let mut widest = 0;
        for q in 0..5 {
            let v = self.lo + (self.hi - self.lo) * q as f32 / 4.0;
            let y = by + bh - 1 - (f64::from(bh - 1) * f64::from(q) / 4.0).round() as i32;
            let label = bar_label(v, self.lo, self.hi);
            widest = widest.max(bar_tick.font.box_size(&label).map_or(0, |(w, _)| w as i32));
            root.draw(&PathElement::new(
                vec![(bx + BAR_W, y), (bx + BAR_W + 4, y)],
                BLACK,
            ))?;
            pen.write(label, (bx + BAR_W + 6, y), &bar_tick)?;
        }
        pen.write(
            "attention weight",
            (bx + BAR_W + 6 + widest + 10, by + bh / 2),
            &axis_up,
        )?;
        Ok(())
    }
}

/// A colour-bar label of `v` on a scale from `lo` to `hi`, with as many decimals as its
/// quarter steps need.
fn bar_label(v: f32, lo: f32, hi: f32) -> String {
    let step = f64::from(hi - lo) / 4.0;
    let decimals = (1.0 - step.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{v:.decimals$}")
}

/// Draws attention weights as a heatmap, rows = queries, columns = keys, into `path`
/// (`.png` or `.svg`).
///
/// `weights` is laid out as [`crate::Attention`] returns it for `heads` heads: `(n, m)` or
/// `(batch, n, m)` for one head, `(H, n, m)` or `(batch, H, n, m)` for `H > 1` (a 4-D array
/// with `H = 1`, as `sdpa` returns, works too). Each head gets a panel (four to a row),
/// titled `head 0`, `head 1`, …; of a batch, the first sequence is drawn and the title says
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
    Format::from_path(path)?;
    let map = Heatmap::new(weights, heads, labels, title)?;
    render(path, &map)
}

// ---------------------------------------------------------------------------------------
// Throughput

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
    Format::from_path(path)?;
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
    fonts()?;
    let legend = text(14.0, false, Pos::new(HPos::Left, VPos::Center));
    let legend_w = lines.iter().try_fold(0, |w, (name, _)| {
        Ok::<_, Error>(w.max(measure(&legend, name)?.0))
    })? + 60;
    let title_style = text(TITLE_SIZE, true, Pos::new(HPos::Center, VPos::Top));
    let title = fit(
        &title_style,
        title,
        CHART_SIZE.0 as i32 + legend_w - 2 * PAD,
    )?;
    let chart = Throughput {
        title,
        title_style,
        lines,
        x: (n_lo / 1.5)..(n_hi * 1.5),
        y: (g_lo / 2.0)..(g_hi * 2.0),
        ns,
        legend,
        legend_w,
    };
    render(path, &chart)
}

/// Ten distinct line colours (matplotlib's "tab10").
const LINE_COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// A throughput chart's lines, axis ranges and legend.
struct Throughput<'a> {
    title: String,
    title_style: TextStyle<'static>,
    lines: Vec<(&'a str, Vec<(f64, f64)>)>,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    /// The lengths measured, ticked on the x axis.
    ns: Vec<f64>,
    legend: TextStyle<'static>,
    /// Width of the legend, right of the chart.
    legend_w: i32,
}

/// Size of a throughput chart's plot area and axes.
const CHART_SIZE: (u32, u32) = (760, 560);

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
        let title_at = (self.size().0 as i32 / 2, PAD);
        Pen { root, nudge }.write(self.title.clone(), title_at, &self.title_style)?;
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
fn format_gflops(v: f64) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{Array3, Array4};

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    /// Rows that sum to 1, with a different largest entry in each row.
    fn softmax_like(n: usize, salt: usize) -> Array2<f32> {
        let mut a = Array2::from_shape_fn((n, n), |(i, j)| {
            1.0 + ((i * 7 + j * 3 + salt) % 5) as f32 + if (i + salt) % n == j { 6.0 } else { 0.0 }
        });
        for mut row in a.rows_mut() {
            let s = row.sum();
            row.mapv_inplace(|v| v / s);
        }
        a
    }

    /// Decodes a PNG: (width, height, RGB bytes).
    fn decode(path: &Path) -> (u32, u32, Vec<u8>) {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        buf.truncate(info.buffer_size());
        (info.width, info.height, buf)
    }

    #[test]
    fn png_heatmap_shows_each_weight_in_its_cell_rows_as_queries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.png");
        let w = softmax_like(5, 0);
        let labels = words("the cat sat on mat");
        heatmap(&path, w.view().into_dyn(), 1, Some(&labels), "weights").unwrap();
        let map = Heatmap::new(w.view().into_dyn(), 1, Some(&labels), "weights").unwrap();
        let (width, height, rgb) = decode(&path);
        assert_eq!((width, height), map.layout.size);
        assert!(map.layout.annotate, "5 × 5 cells carry their values");
        // A pixel near each cell's top-left corner (away from the value written in it) has
        // the colour of that cell's weight: row i is query i, column j is key j.
        let (x0, y0) = map.corner(0);
        let cell = map.layout.cell;
        for ((i, j), &v) in w.indexed_iter() {
            let (x, y) = (x0 + j as i32 * cell + 3, y0 + i as i32 * cell + 3);
            let at = (y as usize * width as usize + x as usize) * 3;
            let want = colour(map.scale(v));
            assert_eq!(
                &rgb[at..at + 3],
                &[want.0, want.1, want.2],
                "cell ({i}, {j})"
            );
        }
        // Some pixel is the top of the colour scale (the largest weight), some the bottom.
        let top = colour(1.0);
        assert!(rgb.chunks(3).any(|p| p == [top.0, top.1, top.2]));
    }

    #[test]
    fn svg_heatmap_has_the_title_token_labels_values_and_colour_bar() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.svg");
        let labels = words("Life is short eat <dessert> first");
        let w = softmax_like(6, 1);
        heatmap(
            &path,
            w.view().into_dyn(),
            1,
            Some(&labels),
            "seed & weights",
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.contains("seed &amp; weights"));
        for l in ["Life", "short", "&lt;dessert&gt;", "first", "query", "key"] {
            // Each token names a row and a column.
            let count = svg.matches(&format!(">\n{l}\n<")).count();
            let want = if l == "query" || l == "key" { 1 } else { 2 };
            assert_eq!(count, want, "{l}");
        }
        assert!(svg.contains(&format!("{:.2}", w[[2, 3]])));
        assert!(svg.contains("attention weight"));
        assert!(!svg.contains("head 0"), "one head, no panel titles");
    }

    #[test]
    fn heads_get_a_panel_each_and_a_batch_its_first_sequence() {
        let dir = tempfile::tempdir().unwrap();
        let heads = 3;
        let w = Array4::from_shape_fn((2, heads, 4, 4), |(b, h, i, j)| {
            softmax_like(4, b * 10 + h)[[i, j]]
        });
        let path = dir.path().join("h.svg");
        heatmap(&path, w.view().into_dyn(), heads, None, "four heads").unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for h in 0..heads {
            assert!(svg.contains(&format!(">\nhead {h}\n<")), "head {h}");
        }
        assert!(!svg.contains("head 3"));
        assert!(svg.contains("(sequence 0 of 2)"));
        assert_eq!(svg.matches(">\nquery\n<").count(), heads);
        // The values written are those of the first sequence.
        assert!(svg.contains(&format!(">\n{:.2}\n<", w[[0, 2, 1, 3]])));

        // (H, n, n) without a batch; panels of several rows of the grid.
        let w3 = Array3::from_shape_fn((6, 3, 3), |(h, i, j)| softmax_like(3, h)[[i, j]]);
        let map = Heatmap::new(w3.view().into_dyn(), 6, None, "six").unwrap();
        assert_eq!(map.panels.len(), 6);
        assert_eq!(map.corner(4).0, map.corner(0).0, "four panels to a row");
        assert!(map.corner(4).1 > map.corner(0).1);
        heatmap(
            &dir.path().join("six.png"),
            w3.view().into_dyn(),
            6,
            None,
            "six",
        )
        .unwrap();

        // (batch, n, n) for one head: the first sequence only.
        let map = Heatmap::new(w3.view().into_dyn(), 1, None, "batch").unwrap();
        assert_eq!(map.panels.len(), 1);
        assert_eq!(map.panels[0].1, w3.index_axis(Axis(0), 0));
        assert!(map.title.ends_with("(sequence 0 of 6)"));
    }

    #[test]
    fn large_matrices_are_drawn_as_block_means_with_sparse_labels() {
        let n = MAX_CELLS + 2;
        let w = Array2::from_shape_fn((n, n), |(i, j)| (i * n + j) as f32);
        let map = Heatmap::new(w.view().into_dyn(), 1, None, "big").unwrap();
        let pooled = &map.panels[0].1;
        assert_eq!(pooled.dim(), (n.div_ceil(2), n.div_ceil(2)));
        assert_eq!(
            pooled[[0, 0]],
            (0.0 + 1.0 + n as f32 + n as f32 + 1.0) / 4.0
        );
        assert!(map.title.contains("means of 2×2 blocks"));
        assert_eq!(
            map.row_ticks.len(),
            pooled.nrows().div_ceil(2),
            "every other row"
        );
        // Labels name the first original row of a block.
        assert_eq!(map.row_ticks[1].1, (2 * map.row_ticks[1].0).to_string());
        assert!(map.layout.size.0 < 1200 && map.layout.size.1 < 1200);
        assert!(!map.layout.annotate);
    }

    #[test]
    fn bad_paths_shapes_labels_and_values_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let w = softmax_like(3, 0).into_dyn();
        let draw = |p: &Path| heatmap(p, w.view(), 1, None, "t");
        for name in ["w.jpg", "w", "w.png.txt"] {
            let e = draw(&dir.path().join(name)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{name}: {e}");
        }
        for missing in ["no/such/dir/w.png", "no/such/dir/w.svg"] {
            let e = draw(&dir.path().join(missing)).unwrap_err();
            assert!(matches!(e, Error::Io { .. }), "{missing}: {e}");
        }
        // A directory where the file should go.
        std::fs::create_dir(dir.path().join("d.png")).unwrap();
        assert!(matches!(
            draw(&dir.path().join("d.png")),
            Err(Error::Io { .. })
        ));

        let ok = dir.path().join("ok.png");
        let e = heatmap(&ok, w.view(), 2, None, "t").unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let e = heatmap(&ok, w.view(), 0, None, "t").unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        let e = heatmap(&ok, w.view(), 1, Some(&words("a b")), "t").unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
        let empty = Array2::<f32>::zeros((0, 0)).into_dyn();
        assert!(heatmap(&ok, empty.view(), 1, None, "t").is_err());
        let mut nan = w.clone();
        nan[[1, 2]] = f32::NAN;
        let e = heatmap(&ok, nan.view(), 1, None, "t").unwrap_err();
        assert!(
            matches!(&e, Error::NonFinite { index, .. } if index == &[1, 2]),
            "{e}"
        );
        assert!(!ok.exists());
    }

    #[test]
    fn throughput_chart_draws_a_line_per_series_with_legend_and_axes() {
        let dir = tempfile::tempdir().unwrap();
        let series = vec![
            Series {
                name: "gpu storage fused".into(),
                points: vec![(256, 12.5), (1024, 40.0), (4096, 80.0)],
            },
            Series {
                name: "cpu f32 ndarray".into(),
                points: vec![(256, 3.0), (1024, 3.5), (4096, f64::INFINITY)],
            },
        ];
        let svg_path = dir.path().join("t.svg");
        throughput(&svg_path, "attention on lavapipe", &series).unwrap();
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        for want in [
            "attention on lavapipe",
            "gpu storage fused",
            "cpu f32 ndarray",
            "sequence length n",
            "GFLOP/s",
        ] {
            assert!(svg.contains(want), "{want}");
        }
        // One polyline per series, the infinite point left out of the CPU line.
        assert!(svg.matches("<polyline").count() >= 2);
        // A marker per point and one per legend entry.
        assert_eq!(svg.matches("<circle").count(), 5 + 2);

        let png_path = dir.path().join("t.png");
        throughput(&png_path, "t", &series).unwrap();
        let (w, h, _) = decode(&png_path);
        assert!(w > CHART_SIZE.0 + 100, "room for the legend: {w}");
        assert_eq!(h, CHART_SIZE.1);
        // A title too long for the figure is cut short.
        let long = format!("adapter {} end", "x".repeat(400));
        throughput(&svg_path, &long, &series).unwrap();
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        assert!(svg.contains("adapter xxx") && svg.contains("x…") && !svg.contains(" end"));

        let nothing = [Series {
            name: "x".into(),
            points: vec![(0, 1.0), (16, 0.0)],
        }];
        let e = throughput(&dir.path().join("n.svg"), "t", &nothing).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(throughput(&dir.path().join("t.pdf"), "t", &series).is_err());
        let e = throughput(&dir.path().join("none/t.svg"), "t", &series).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
    }

    #[test]
    fn helpers() {
        assert_eq!(
            Format::from_path(Path::new("a/B.PNG")).unwrap(),
            Format::Png
        );
        assert_eq!(Format::from_path(Path::new("b.svg")).unwrap(), Format::Svg);
        assert_eq!(
            [0.3, 1.0, 1.4, 3.0, 7.0, 11.0].map(nice_stride),
            [1, 1, 2, 5, 10, 20]
        );
        assert_eq!(bar_label(0.15, 0.0, 0.3), "0.150");
        assert_eq!(bar_label(0.5, 0.0, 1.0), "0.50");
        assert_eq!(format_gflops(123.4), "123");
        assert_eq!(format_gflops(2.5), "2.5");
        assert_eq!(format_gflops(0.05), "0.05");
        assert_eq!(
            (colour(0.0), colour(1.0)),
            (RGBColor(68, 1, 84), RGBColor(253, 231, 37))
        );
        assert_eq!(ink(colour(0.0)), WHITE);
        assert_eq!(ink(colour(1.0)), BLACK);
    }
}
