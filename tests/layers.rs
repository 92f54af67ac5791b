//! The crate's ground floor, so that a reader can take it one layer at a time: the top-level
//! modules of `src/` import each other in layers, never in a circle (the device layer at the
//! bottom, the kernels above it, the settings above those, the op on top), and the op's two
//! types keep a small surface.
//!
//! Reads the source tree, no GPU: every `crate::<name>` path (and `$crate::`, `super::`
//! chains that climb to the root, `crate::{…}` groups) in code that is not test-only, with
//! comments and string literals blanked first. A `<name>` that is a top-level module is an
//! import of it; one that the crate root re-exports (`crate::Dtype`) is an import of the
//! module it comes from.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most public methods `Attention` and `Layer` may have.
const MAX_ATTENTION_METHODS: usize = 12;
const MAX_LAYER_METHODS: usize = 10;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// `text` with comments and the contents of string and character literals replaced by
/// spaces (newlines kept; byte offsets and line numbers stay).
fn blank_comments_and_strings(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out: Vec<char> = Vec::with_capacity(c.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        // Line comment (doc comments included).
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
            continue;
        }
        // Block comment, nested.
        if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push(' ');
                    out.push(' ');
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push(' ');
                    out.push(' ');
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            continue;
        }
        // Raw string: r"…", r#"…"#, br"…" (an identifier ending in r is not one).
        let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if c[i] == 'r' && !ident_before && matches!(next, Some('"') | Some('#')) {
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) == Some(&'"') {
                out.extend(&c[i..=j]);
                i = j + 1;
                loop {
                    if i >= c.len() {
                        break;
                    }
                    if c[i] == '"' && (1..=hashes).all(|h| c.get(i + h) == Some(&'#')) {
                        out.extend(&c[i..=i + hashes]);
                        i += hashes + 1;
                        break;
                    }
                    out.push(blank(c[i]));
                    i += 1;
                }
                continue;
            }
        }
        // String.
        if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            if i < c.len() {
                out.push('"');
                i += 1;
            }
            continue;
        }
        // Character literal ('x', '\n', '\u{1F600}'); a lifetime ('a) is left alone.
        if c[i] == '\'' {
            let literal_end = if next == Some('\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(end) = literal_end {
                out.push('\'');
                out.extend((i + 1..end).map(|_| ' '));
                out.push('\'');
                i = end + 1;
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    // One output char per input char so far: blanks take the bytes of what they replace, so
    // byte offsets into the blanked text are offsets into the original.
    debug_assert_eq!(out.len(), c.len());
    out.iter()
        .zip(&c)
        .map(|(&o, &orig)| match o {
            ' ' => " ".repeat(orig.len_utf8()),
            o => o.to_string(),
        })
        .collect()
}

/// Where the item that starts at `start` ends (exclusive): after its first `;` outside any
/// brackets, or after the braces it opens, whichever comes first.
fn item_end(code: &[u8], start: usize) -> usize {
    let mut depth = 0i32;
    let mut i = start;
    while i < code.len() {
        match code[i] {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b';' if depth == 0 => return i + 1,
            b'{' if depth == 0 => {
                let mut braces = 0i32;
                while i < code.len() {
                    match code[i] {
                        b'{' => braces += 1,
                        b'}' => {
                            braces -= 1;
                            if braces == 0 {
                                return i + 1;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                return code.len();
            }
            _ => {}
        }
        i += 1;
    }
    code.len()
}

/// Where the brackets opened at `open` close (exclusive).
fn bracket_end(code: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (k, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'[' => depth += 1,
            b']' => {
                depth -= 1;
                if depth == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// One source file's code outside `#[cfg(test)]` items (blanked), and the files of the
/// test-only modules it declares (`#[cfg(test)] mod tests;`, with its `#[path]` if any).
fn without_test_items(path: &Path, code: &str) -> (String, Vec<PathBuf>) {
    let bytes = code.as_bytes();
    let mut kept = bytes.to_vec();
    let mut test_files = Vec::new();
    let marker = "#[cfg(test)]";
    let mut from = 0;
    while let Some(at) = code[from..].find(marker).map(|p| p + from) {
        let mut i = at + marker.len();
        // The item's other attributes.
        let mut path_attr = None;
        loop {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            if code[i..].starts_with("#[") {
                let end = bracket_end(bytes, i + 1);
                let attr = &code[i..end];
                if attr.contains("path") {
                    // The literal was blanked: read it from the original text.
                    path_attr = Some((i, end));
                }
                i = end;
            } else {
                break;
            }
        }
        let end = item_end(bytes, i);
        let item = code[i..end].trim();
        let words: Vec<&str> = item.split_whitespace().collect();
        if words.first() == Some(&"mod") && item.ends_with(';') {
            let name = words[1].trim_end_matches(';');
            test_files.push(child_file(path, name, path_attr));
        }
        for b in &mut kept[at..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
        from = end;
    }
    let kept = String::from_utf8(kept).expect("blanking keeps UTF-8 boundaries");
    (kept, test_files)
}

/// The file of module `name` declared in `parent` (`#[path]` given as its span in the
/// original text, which is read again here).
fn child_file(parent: &Path, name: &str, path_attr: Option<(usize, usize)>) -> PathBuf {
    let dir = parent.parent().unwrap();
    let stem = parent.file_stem().unwrap().to_str().unwrap();
    let own_dir = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    if let Some((start, end)) = path_attr {
        let original = fs::read_to_string(parent).unwrap();
        let attr = &original[start..end];
        let quoted = attr.split('"').nth(1).expect("#[path = \"…\"]");
        return dir.join(quoted);
    }
    let file = own_dir.join(format!("{name}.rs"));
    if file.exists() {
        file
    } else {
        own_dir.join(name).join("mod.rs")
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The crate's top-level modules (`mod x;` in `src/lib.rs`) and the names its root
/// re-exports, each with the module it comes from.
fn root() -> (BTreeSet<String>, BTreeMap<String, String>) {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    let (code, _) = without_test_items(&src().join("lib.rs"), &blank_comments_and_strings(&lib));
    let mut modules = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    for statement in code.split(';') {
        let words: Vec<&str> = statement.split_whitespace().collect();
        let Some(kw) = words.iter().position(|w| *w == "mod" || *w == "use") else {
            continue;
        };
        if words[kw] == "mod" && words.len() == kw + 2 && !statement.contains('{') {
            modules.insert(words[kw + 1].to_string());
        }
        if words[kw] == "use" && words[..kw].iter().any(|w| w.starts_with("pub")) {
            let path: String = words[kw + 1..].concat();
            let module = path
                .split("::")
                .next()
                .unwrap()
                .trim_start_matches("crate::");
            // `pub use module::{A, B}` or `pub use module::sub::A`: the last names.
            let tail = path.rsplit_once("::").map_or(path.as_str(), |(_, t)| t);
            let names = tail.trim_matches(|c| c == '{' || c == '}');
            for name in names.split(',').filter(|n| !n.is_empty()) {
                let name = name.rsplit(" as ").next().unwrap();
                reexports.insert(name.to_string(), module.to_string());
            }
        }
    }
    // `pub use wgpu;`, `pub use half;`: external crates, not modules.
    reexports.retain(|_, m| modules.contains(m));
    (modules, reexports)
}

/// The identifiers right after `crate::`-like prefixes in `code`, with their byte offsets:
/// `crate::a`, `$crate::a`, `crate::{a::X, b}` (each of the group), and `super::…::a` chains
/// that climb from `depth` (the file's module depth below its top-level module) to the root.
fn root_paths(code: &str, depth: usize) -> Vec<(usize, String)> {
    let b = code.as_bytes();
    let ident_at = |mut i: usize| -> (String, usize) {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let s = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        (code[s..i].to_string(), i)
    };
    let is_ident = |i: usize| b[i].is_ascii_alphanumeric() || b[i] == b'_';
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_word = i == 0 || !(is_ident(i - 1) || b[i - 1] == b':');
        let after_dollar = i > 0 && b[i - 1] == b'$';
        if (starts_word || after_dollar) && code[i..].starts_with("crate::") {
            let j = i + "crate::".len();
            if code[j..].trim_start().starts_with('{') {
                // A group: the first name of each comma-separated entry at its top level.
                let open = j + code[j..].find('{').unwrap();
                let mut level = 0;
                let mut entry_start = open + 1;
                for (k, ch) in code[open..].char_indices() {
                    let k = open + k;
                    match ch {
                        '{' => level += 1,
                        '}' | ',' if level == 1 => {
                            let (name, _) = ident_at(entry_start);
                            if !name.is_empty() {
                                found.push((i, name));
                            }
                            entry_start = k + 1;
                            if ch == '}' {
                                break;
                            }
                        }
                        '}' => level -= 1,
                        _ => {}
                    }
                }
            } else {
                found.push((i, ident_at(j).0));
            }
            i = j;
            continue;
        }
        if starts_word && code[i..].starts_with("super::") {
            let mut j = i;
            let mut ups = 0;
            while code[j..].starts_with("super::") {
                ups += 1;
                j += "super::".len();
            }
            if ups > depth {
                found.push((i, ident_at(j).0));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    found
}

/// `from -> to -> [where]` for every import between distinct top-level modules.
type Graph = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn import_graph() -> (BTreeSet<String>, Graph) {
    let (modules, reexports) = root();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut code_of = BTreeMap::new();
    let mut test_only = BTreeSet::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        let (code, tests) = without_test_items(f, &blank_comments_and_strings(&text));
        test_only.extend(tests);
        code_of.insert(f.clone(), code);
    }
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for (f, code) in &code_of {
        let rel = f.strip_prefix(src()).unwrap();
        let parts: Vec<&str> = rel.iter().map(|p| p.to_str().unwrap()).collect();
        if parts == ["lib.rs"] || parts[0] == "bin" || test_only.contains(f) {
            continue; // lib.rs, the binary, test-only files
        }
        let top = parts[0].trim_end_matches(".rs").to_string();
        if !modules.contains(&top) {
            continue;
        }
        // Module depth below the top-level module: src/a.rs and src/a/mod.rs are 0,
        // src/a/b.rs is 1, src/a/b/mod.rs is 1.
        let is_mod = matches!(parts.last(), Some(&"mod.rs"));
        let depth = parts.len() - 1 - usize::from(is_mod);
        for (at, name) in root_paths(code, depth) {
            let target = if modules.contains(&name) {
                name.clone()
            } else if let Some(m) = reexports.get(&name) {
                m.clone()
            } else {
                continue;
            };
            if target == top {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            let site = format!("src/{}:{line} ({name})", rel.display());
            graph
                .get_mut(&top)
                .unwrap()
                .entry(target)
                .or_default()
                .push(site);
        }
    }
    (modules, graph)
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph[v].keys() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// One circle through `start` inside `component`, as `a -> b -> … -> a` (breadth-first, so
/// the shortest one).
fn one_circle(graph: &Graph, component: &[String]) -> Vec<String> {
    let start = &component[0];
    let inside: BTreeSet<&String> = component.iter().collect();
    let mut came_from: BTreeMap<&String, &String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph[v].keys().filter(|w| inside.contains(w)) {
            if w == start {
                let mut path = vec![start.clone()];
                let mut at = v;
                while at != start {
                    path.push(at.clone());
                    at = came_from[at];
                }
                path.push(start.clone());
                path.reverse();
                return path;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("a strongly connected component has a circle through each member")
}

#[test]
fn top_level_modules_import_each_other_in_layers() {
    let (modules, graph) = import_graph();
    // The reading works: the crate has its layers' modules and they import something.
    for m in ["attention", "kernels", "gpu", "error"] {
        assert!(modules.contains(m), "no top-level module {m}: {modules:?}");
    }
    assert!(
        graph["attention"].contains_key("kernels") || graph["attention"].contains_key("gpu"),
        "attention imports nothing below it? {:?}",
        graph["attention"].keys().collect::<Vec<_>>()
    );
    let found = circles(&graph);
    let mut report = String::new();
    for component in &found {
        let circle = one_circle(&graph, component);
        report.push_str(&format!(
            "\nmodules {component:?} import each other, e.g. {}:\n",
            circle.join(" -> ")
        ));
        let inside: Vec<String> = component
            .iter()
            .flat_map(|a| {
                graph[a]
                    .keys()
                    .filter(|b| component.contains(b))
                    .map(move |b| format!("{a} -> {b}"))
            })
            .collect();
        report.push_str(&format!("  (imports among them: {})\n", inside.join(", ")));
        for edge in circle.windows(2) {
            let sites = &graph[&edge[0]][&edge[1]];
            report.push_str(&format!("  {} -> {}:\n", edge[0], edge[1]));
            for site in sites.iter().take(5) {
                report.push_str(&format!("      {site}\n"));
            }
            if sites.len() > 5 {
                report.push_str(&format!("      … and {} more\n", sites.len() - 5));
            }
        }
    }
    let layering: Vec<String> = graph
        .iter()
        .map(|(m, to)| format!("  {m} -> {:?}", to.keys().collect::<Vec<_>>()))
        .collect();
    assert!(
        found.is_empty(),
        "the top-level modules import each other in a circle:{report}\nall imports:\n{}",
        layering.join("\n")
    );
    // No circle: each module's floor is one above the highest it imports (`--nocapture`).
    let mut floor: BTreeMap<&str, usize> = BTreeMap::new();
    while floor.len() < graph.len() {
        for (m, to) in &graph {
            if !floor.contains_key(m.as_str()) && to.keys().all(|t| floor.contains_key(t.as_str()))
            {
                let f = to.keys().map(|t| floor[t.as_str()] + 1).max().unwrap_or(0);
                floor.insert(m, f);
            }
        }
    }
    for level in 0..=floor.values().copied().max().unwrap_or(0) {
        let here: Vec<&str> = floor
            .iter()
            .filter(|(_, &f)| f == level)
            .map(|(m, _)| *m)
            .collect();
        println!("floor {level}: {}", here.join(", "));
    }
    println!("imports:\n{}", layering.join("\n"));
}

/// The `pub fn` and `pub async fn` names inside `impl <ty> {` blocks of non-test code under
/// `src/` (not `pub(crate)`, not trait impls), with their files.
fn public_methods(ty: &str) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut test_only = BTreeSet::new();
    let mut code_of = BTreeMap::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        let (code, tests) = without_test_items(f, &blank_comments_and_strings(&text));
        test_only.extend(tests);
        code_of.insert(f.clone(), code);
    }
    let mut names = Vec::new();
    for (f, code) in code_of.iter().filter(|(f, _)| !test_only.contains(*f)) {
        let b = code.as_bytes();
        let mut from = 0;
        while let Some(at) = code[from..].find("impl").map(|p| p + from) {
            from = at + 4;
            let word_start = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
            let word_end = b
                .get(at + 4)
                .is_some_and(|c| !(c.is_ascii_alphanumeric() || *c == b'_'));
            if !word_start || !word_end {
                continue;
            }
            let Some(open) = code[at..].find('{').map(|p| p + at) else {
                continue;
            };
            // `impl Attention {`, `impl<'a> Layer {`: the header without generics names the
            // type alone (a trait impl has `for`).
            let header = &code[at + 4..open];
            let header = match header.trim_start().strip_prefix('<') {
                Some(rest) => rest.split_once('>').map_or("", |(_, h)| h),
                None => header,
            };
            let words: Vec<&str> = header.split_whitespace().collect();
            if words.as_slice() != [ty] {
                continue;
            }
            let end = item_end(b, open);
            let body = &code[open + 1..end - 1];
            // Methods at the block's own level.
            let mut level = 0;
            let mut line_start = true;
            let bb = body.as_bytes();
            let mut k = 0;
            while k < bb.len() {
                if level == 0 && line_start && !bb[k].is_ascii_whitespace() {
                    let tokens: Vec<&str> = body[k..].split_whitespace().take(4).collect();
                    let name = match tokens.as_slice() {
                        ["pub", "fn", name, ..] => Some(*name),
                        ["pub", "async", "fn", name, ..] => Some(*name),
                        ["pub", "const", "fn", name, ..] => Some(*name),
                        ["pub", "unsafe", "fn", name, ..] => Some(*name),
                        _ => None,
                    };
                    if let Some(name) = name {
                        let name = name.split(['(', '<']).next().unwrap();
                        let rel = f.strip_prefix(src()).unwrap();
                        names.push(format!("{name} (src/{})", rel.display()));
                    }
                }
                match bb[k] {
                    b'{' => level += 1,
                    b'}' => level -= 1,
                    _ => {}
                }
                line_start = bb[k] == b'\n' || (line_start && bb[k].is_ascii_whitespace());
                k += 1;
            }
            from = end;
        }
    }
    names.sort();
    names
}

#[test]
fn attention_and_layer_keep_a_small_public_surface() {
    let attention = public_methods("Attention");
    let layer = public_methods("Layer");
    // The reading works: the builder's methods are found.
    assert!(
        attention.iter().any(|m| m.starts_with("new "))
            && attention.iter().any(|m| m.starts_with("run ")),
        "Attention::new and Attention::run not found: {attention:?}"
    );
    let mut over = Vec::new();
    for (ty, methods, max) in [
        ("Attention", &attention, MAX_ATTENTION_METHODS),
        ("Layer", &layer, MAX_LAYER_METHODS),
    ] {
        if methods.len() > max {
            over.push(format!(
                "{ty} has {} public methods, at most {max}:\n  {}",
                methods.len(),
                methods.join("\n  ")
            ));
        }
    }
    assert!(over.is_empty(), "{}", over.join("\n"));
}

/// The reader itself, on small inputs: comments and strings do not count, test-only items
/// do not count, groups and `super` chains do.
#[test]
fn the_reader_sees_imports_in_code_only() {
    let code = blank_comments_and_strings(
        "use crate::a::X; // crate::b\n/* crate::c /* nested crate::d */ */\nlet s = \"crate::e\";\nlet r = r#\"crate::f\"#;\nlet c = '\"'; use crate::{g::Y, h};\n$crate::i::m!();\nfn f<'a>(x: &'a str) { super::super::j::k() }\n",
    );
    let names: Vec<String> = root_paths(&code, 1).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["a", "g", "h", "i", "j"]);
    assert!(root_paths(&code, 2).iter().all(|(_, n)| n != "j"));
    let (kept, files) = without_test_items(
        Path::new("/x/src/m.rs"),
        "use crate::a;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod more {\n use crate::b;\n}\n#[cfg(test)]\npub(crate) fn t() { crate::c() }\n",
    );
    let names: Vec<String> = root_paths(&kept, 0).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["a"]);
    assert_eq!(files.len(), 1);
}
