//! No import circle between the files of `src/`: each file is a module (as in Python), a
//! `crate::` or `super::` path from one file to another is an import, resolved to the file that
//! defines the name (through the `pub use` re-exports of a `mod.rs` or `lib.rs`). A module's own
//! children (`mod x;` and paths relative to it) are its parts, not imports; test code (after
//! `#[cfg(test)]`, `*_test.rs`) is left out. `now_ms` living in `worker.rs` made one circle of
//! five files (worker -> residency -> artifacts -> worker, heartbeat and runtime beside it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`; `src/lib.rs` is the crate root.
fn module_of(relative: &Path) -> Module {
    let mut parts: Module = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// Product code of a file: what comes before its first `#[cfg(test)]`, comments dropped.
fn product_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
    code.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `crate::a::b` / `super::a` path in `code` (a `{x, y}` group as one path per name),
/// as module segments from the crate root.
fn paths(code: &str, here: &Module) -> Vec<Module> {
    let mut found = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let at = |word: &str| chars[i..].iter().take(word.len()).copied().eq(word.chars());
        let boundary = i == 0 || !is_ident(chars[i - 1]);
        let (start, mut base): (usize, Module) = if boundary && at("crate::") {
            (i + 7, Vec::new())
        } else if boundary && at("super::") {
            (i + 7, here[..here.len().saturating_sub(1)].to_vec())
        } else {
            i += 1;
            continue;
        };
        let mut j = start;
        loop {
            let begin = j;
            while j < chars.len() && is_ident(chars[j]) {
                j += 1;
            }
            if j > begin {
                base.push(chars[begin..j].iter().collect());
            }
            if chars[j..].starts_with(&[':', ':']) {
                j += 2;
                if chars.get(j) == Some(&'{') {
                    let end = (j..chars.len()).find(|&k| chars[k] == '}').unwrap_or(j);
                    let group: String = chars[j + 1..end].iter().collect();
                    for name in group.split(',') {
                        let name = name.trim().split("::").next().unwrap_or_default();
                        let mut path = base.clone();
                        if !name.is_empty() && name != "self" {
                            path.push(name.to_string());
                        }
                        found.push(path);
                    }
                    j = end;
                    base.clear();
                    break;
                }
                continue;
            }
            break;
        }
        if !base.is_empty() {
            found.push(base);
        }
        i = j.max(i + 1);
    }
    found
}

/// `pub use child::{A, B};` of a file: name -> child module.
fn reexports(code: &str, here: &Module) -> BTreeMap<String, Module> {
    let mut names = BTreeMap::new();
    for statement in code.split(';') {
        let Some(rest) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((child, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items.trim().trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.trim().rsplit(' ').next().unwrap_or_default();
            if !name.is_empty() {
                let mut module = here.clone();
                module.push(child.trim().to_string());
                names.insert(name.to_string(), module);
            }
        }
    }
    names
}

struct Crate {
    files: BTreeMap<Module, String>,
    reexports: BTreeMap<Module, BTreeMap<String, Module>>,
}

impl Crate {
    /// The file a path lands in: its longest prefix that is a module, then through that
    /// module's re-exports.
    fn resolve(&self, path: &Module) -> Option<Module> {
        let mut module = (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| self.files.contains_key(m))?;
        while let Some(next) = path
            .get(module.len())
            .and_then(|name| self.reexports.get(&module)?.get(name))
        {
            if !self.files.contains_key(next) || next.len() <= module.len() {
                break;
            }
            module = next.clone();
        }
        Some(module)
    }
}

fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut krate = Crate {
        files: BTreeMap::new(),
        reexports: BTreeMap::new(),
    };
    for path in &files {
        let relative = path.strip_prefix(&root).unwrap();
        let name = relative.display().to_string();
        if name == "main.rs" || name.ends_with("_test.rs") {
            continue;
        }
        let module = module_of(relative);
        let code = product_code(&std::fs::read_to_string(path).unwrap());
        krate
            .reexports
            .insert(module.clone(), reexports(&code, &module));
        krate.files.insert(module, code);
    }
    let label = |m: &Module| {
        if m.is_empty() {
            "lib".to_string()
        } else {
            m.join("::")
        }
    };
    let mut graph = BTreeMap::new();
    for (module, code) in &krate.files {
        let targets: BTreeSet<String> = paths(code, module)
            .iter()
            .filter_map(|p| krate.resolve(p))
            .filter(|target| target != module)
            .map(|target| label(&target))
            .collect();
        graph.insert(label(module), targets);
    }
    graph
}

/// A circle in `graph`, as the modules along it, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut found = stack[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, done, stack) {
                return Some(found);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn no_module_imports_itself_through_others() {
    let graph = imports();
    // The graph is read, not empty: the paths this test must see are there.
    assert!(graph["heartbeat"].contains("clock"), "{graph:?}");
    assert!(graph["worker::batch"].contains("worker"), "{graph:?}");
    assert!(graph["error"].contains("protocol::codes"), "{graph:?}");
    assert_eq!(circle(&graph), None, "{graph:#?}");
}

#[test]
fn a_circle_is_found() {
    let here: Module = vec!["worker".into()];
    assert_eq!(
        paths(
            "use crate::protocol::{self, Placement};\ncrate::clock::now_ms()",
            &here
        ),
        [
            vec!["protocol".to_string()],
            vec!["protocol".into(), "Placement".into()],
            vec!["clock".into(), "now_ms".into()]
        ]
    );
    let edges = |pairs: &[(&str, &str)]| {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            graph
                .entry(a.to_string())
                .or_default()
                .insert(b.to_string());
            graph.entry(b.to_string()).or_default();
        }
        graph
    };
    let found = circle(&edges(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
    assert_eq!(found.map(|c| c.len()), Some(4));
    assert_eq!(circle(&edges(&[("a", "b"), ("a", "c"), ("b", "c")])), None);
}
