//! Colours: the heatmap's scale and its colour-bar labels, the ink for text on a cell, and
//! the throughput chart's line colours.

use plotters::style::{RGBColor, BLACK, WHITE};

/// The colour of `t` in [0, 1] on a viridis-like scale (dark blue-violet to yellow),
/// interpolated between five anchors.
pub(super) fn colour(t: f64) -> RGBColor {
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
pub(super) fn ink(c: RGBColor) -> RGBColor {
    let luma = 0.299 * f64::from(c.0) + 0.587 * f64::from(c.1) + 0.114 * f64::from(c.2);
    if luma > 140.0 {
        BLACK
    } else {
        WHITE
    }
}

/// The colour bar's five ticks on a scale from `lo` to `hi`, bottom to top: the value at
/// each quarter and its label.
pub(super) fn bar_ticks(lo: f32, hi: f32) -> [(f32, String); 5] {
    std::array::from_fn(|q| {
        let v = lo + (hi - lo) * q as f32 / 4.0;
        (v, bar_label(v, lo, hi))
    })
}

/// A colour-bar label of `v` on a scale from `lo` to `hi`, with as many decimals as its
/// quarter steps need.
pub(super) fn bar_label(v: f32, lo: f32, hi: f32) -> String {
    let step = f64::from(hi - lo) / 4.0;
    let decimals = (1.0 - step.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{v:.decimals$}")
}

/// Ten distinct line colours (matplotlib's "tab10").
pub(super) const LINE_COLOURS: [RGBColor; 10] = [
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
