//! Prints naga's IR of one function of a WGSL file (for debugging the interpreter):
//! `cargo run -p wgsl-sanitizer --example dump_ir -- FILE [FUNCTION]`.
fn main() {
    let mut args = std::env::args().skip(1);
    let file = args.next().expect("usage: dump_ir FILE [FUNCTION]");
    let name = args.next().unwrap_or_else(|| "main".into());
    let src = std::fs::read_to_string(file).expect("read");
    let module = naga::front::wgsl::parse_str(&src).expect("parse");
    for ep in &module.entry_points {
        if ep.name == name {
            println!("{:#?}", ep.function);
        }
    }
    for (_, f) in module.functions.iter() {
        if f.name.as_deref() == Some(name.as_str()) {
            println!("{f:#?}");
        }
    }
}
