//! Text: the embedded font, text styles, measuring and fitting, and a pen that places text
//! alike on every backend.

use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::DrawResult;
use crate::error::{Error, Result};

/// Margin around a figure, in pixels.
pub(super) const PAD: i32 = 16;
/// Font sizes: a figure's title, a panel's title, an axis's name.
pub(super) const TITLE_SIZE: f64 = 22.0;
pub(super) const PANEL_TITLE_SIZE: f64 = 18.0;
pub(super) const AXIS_SIZE: f64 = 16.0;

/// How far plotters' `ab_glyph` text sits above where an SVG viewer puts it, in font sizes:
/// it sets the baseline half a size below the top of a text box 1/1.24 of a size tall.
pub(super) const BITMAP_NUDGE: f64 = 0.2;

/// Registers the embedded DejaVu Sans as plotters' `sans-serif`, once per process.
pub(super) fn fonts() -> Result<()> {
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
pub(super) fn text(size: f64, bold: bool, pos: Pos) -> TextStyle<'static> {
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

/// The style of a figure's title: bold, centred above the point it is written at.
pub(super) fn title_style() -> TextStyle<'static> {
    text(TITLE_SIZE, true, Pos::new(HPos::Center, VPos::Top))
}

/// `text`'s width and height in `style`, in pixels (unrotated).
pub(super) fn measure(style: &TextStyle, text: &str) -> Result<(i32, i32)> {
    let ((x0, y0), (x1, y1)) = style
        .font
        .layout_box(text)
        .map_err(|e| Error::invalid("font", e.to_string()))?;
    Ok((x1 - x0, y1 - y0))
}

/// The widest of `texts` in `style`, in pixels (0 for none).
pub(super) fn widest<'a>(
    style: &TextStyle,
    texts: impl IntoIterator<Item = &'a str>,
) -> Result<i32> {
    texts
        .into_iter()
        .try_fold(0, |w, t| Ok(w.max(measure(style, t)?.0)))
}

/// `title`, cut short with "…" if it is wider than `width` in `style` (a long sentence, a
/// long adapter name).
pub(super) fn fit(style: &TextStyle, title: &str, width: i32) -> Result<String> {
    let mut chars: Vec<char> = title.chars().collect();
    let mut fitted = title.to_string();
    while measure(style, &fitted)?.0 > width && chars.len() > 1 {
        chars.pop();
        fitted = chars.iter().collect::<String>().trim_end().to_string() + "…";
    }
    Ok(fitted)
}

/// Writes text on a drawing area, moved `nudge` times its size down along the text's own
/// vertical, so that anchored text sits where it is anchored on every backend.
pub(super) struct Pen<'a, DB: DrawingBackend> {
    pub root: &'a DrawingArea<DB, Shift>,
    pub nudge: f64,
}

impl<DB: DrawingBackend> Pen<'_, DB> {
    pub fn write(
        &self,
        s: impl Into<String>,
        (x, y): (i32, i32),
        style: &TextStyle,
    ) -> DrawResult<DB> {
        let d = (style.font.get_size() * self.nudge).round() as i32;
        let at = match style.font.get_transform() {
            FontTransform::Rotate90 => (x - d, y),
            FontTransform::Rotate180 => (x, y - d),
            FontTransform::Rotate270 => (x + d, y),
            _ => (x, y + d),
        };
        self.root.draw(&Text::new(s.into(), at, style.clone()))
    }

    /// Writes a figure's title centred at its top, the figure being `width` pixels wide.
    pub fn title(&self, title: &str, width: u32) -> DrawResult<DB> {
        self.write(title, (width as i32 / 2, PAD), &title_style())
    }
}
