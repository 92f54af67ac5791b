//! Pictures of the results: the attention weights as a labelled heatmap ([`heatmap`]) and
//! throughput against the sequence length as a line chart ([`throughput`]), as PNG or SVG
//! (chosen by the file's extension), drawn with `plotters`. Built with the `plot` feature.
//!
//! Text is drawn with DejaVu Sans, embedded in the binary (the `dejavu` crate), through
//! plotters' `ab_glyph` font backend: no system font, fontconfig or freetype is needed, so
//! the pictures look the same on every machine. SVG files name the family `sans-serif`.
//!
//! Inside: `heatmap.rs` checks the weights and draws the panels, `layout.rs` places them,
//! `chart.rs` draws the throughput chart, `colour.rs` holds the colour scales and `text.rs`
//! the font and the text placement; this file picks the backend and writes the file.

mod chart;
mod colour;
mod heatmap;
mod layout;
#[cfg(test)]
mod tests;
mod text;

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

pub use chart::{throughput, Series};
pub use heatmap::heatmap;

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

/// What drawing on a plotters backend returns.
type DrawResult<DB> =
    std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// A picture that can be drawn on any plotters backend.
trait Figure {
    /// Its size in pixels.
    fn size(&self) -> (u32, u32);
    /// Draws it on `root`, text that it places itself moved down by `nudge` times its size
    /// (see [`text::Pen`]).
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, nudge: f64)
        -> DrawResult<DB>;
}

/// Draws `figure` in `format` (which the caller read from `path` before doing any work) and
/// writes the file.
fn render(path: &Path, format: Format, figure: &impl Figure) -> Result<()> {
    match format {
        Format::Png => paint(
            path,
            BitMapBackend::new(path, figure.size()).into_drawing_area(),
            figure,
            text::BITMAP_NUDGE,
        ),
        Format::Svg => paint(
            path,
            SVGBackend::new(path, figure.size()).into_drawing_area(),
            figure,
            0.0,
        ),
    }
}

/// Draws `figure` on `root` and flushes the backend to `path`.
fn paint<DB: DrawingBackend>(
    path: &Path,
    root: DrawingArea<DB, Shift>,
    figure: &impl Figure,
    nudge: f64,
) -> Result<()> {
    figure
        .draw(&root, nudge)
        .and_then(|()| root.present())
        .map_err(|e| Error::io(path, format!("cannot draw the plot: {e}")))
}
