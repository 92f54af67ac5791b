//! Parses every `.wgsl` file under a folder and checks that the sanitizer supports each
//! compute entry point: `cargo run -p wgsl-sanitizer --example check_dir -- DIR`.
use std::path::Path;

fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.path());
    for e in entries {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "wgsl") {
            out.push(p);
        }
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: check_dir DIR");
    let mut files = Vec::new();
    walk(Path::new(&dir), &mut files);
    let (mut ok, mut bad) = (0, 0);
    for f in &files {
        let src = std::fs::read_to_string(f).expect("read");
        let r = wgsl_sanitizer::Shader::parse(&src).and_then(|s| {
            for ep in s.entry_points() {
                s.check_supported(&ep)?;
            }
            Ok(())
        });
        match r {
            Ok(()) => ok += 1,
            Err(e) => {
                bad += 1;
                println!(
                    "{}: {}",
                    f.display(),
                    e.to_string().lines().next().unwrap_or("")
                );
            }
        }
    }
    println!("{ok} supported, {bad} not, of {}", files.len());
}
