//! The pictures checked: pixels of PNGs, elements of SVGs, layouts, and bad input.

use std::path::Path;

use ndarray::{Array2, Array3, Array4, Axis};
use plotters::style::{RGBColor, BLACK, WHITE};

use super::chart::{format_gflops, CHART_SIZE};
use super::colour::{bar_label, colour, ink};
use super::heatmap::Heatmap;
use super::layout::nice_stride;
use super::*;

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
    let (x0, y0) = map.layout.corner(0);
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
    assert_eq!(
        map.layout.corner(4).0,
        map.layout.corner(0).0,
        "four panels to a row"
    );
    assert!(map.layout.corner(4).1 > map.layout.corner(0).1);
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
        map.layout.row_ticks.len(),
        pooled.nrows().div_ceil(2),
        "every other row"
    );
    // Labels name the first original row of a block.
    assert_eq!(
        map.layout.row_ticks[1].1,
        (2 * map.layout.row_ticks[1].0).to_string()
    );
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
