//! The library's structure, read from its source: no import cycle between its top-level
//! modules (DESIGN.md's layer diagram is this graph). A module is a file `src/x.rs` with its
//! folder `src/x/`; an edge is a `crate::y` path in its code (comments are not code), where
//! `y` is a module or a name the crate root re-exports from one (`crate::Locks` is `client`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the modules it names, with a file that names each.
type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {dir:?}: {e}"));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`None`: the crate root).
fn module_of(root: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(root).ok()?.components().next()?;
    let first = first.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_owned())
}

/// The first path segments after `crate::` in `code`, `use crate::{a, b::c}` groups included.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The first segment of each path at the group's own level: `a` and `c` of
            // `{a::{b, x}, c}`.
            let (mut depth, mut start) = (0usize, true);
            let mut segment = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_ascii_alphanumeric() || c == '_') => segment.push(c),
                    _ if start && !segment.is_empty() => {
                        names.insert(std::mem::take(&mut segment));
                        start = false;
                    }
                    _ => {}
                }
            }
            if !segment.is_empty() {
                names.insert(segment);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
        }
    }
    names
}

/// The names the crate root re-exports (`pub use crate::m::{A, B as C};`), and the module
/// each comes from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(at) = statement.find("pub use crate::") else {
            continue;
        };
        let path = &statement[at + "pub use crate::".len()..];
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        for name in rest
            .trim_matches(|c: char| c == '{' || c == '}' || c.is_whitespace())
            .split(',')
        {
            let name = name.rsplit(" as ").next().unwrap_or(name);
            let name = name.rsplit("::").next().unwrap_or(name).trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    names
}

fn graph() -> Graph {
    let root = source_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(&root, f)).collect();
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("read lib.rs");
    let reexports = root_reexports(&lib);
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for file in &files {
        let Some(module) = module_of(&root, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {file:?}: {e}"));
        let code: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for named in named_modules(&code) {
            let named = match reexports.get(&named) {
                Some(from) if !modules.contains(&named) => from.clone(),
                _ => named,
            };
            if named != module && modules.contains(&named) {
                graph
                    .get_mut(&module)
                    .expect("every module is a node")
                    .entry(named)
                    .or_insert_with(|| file.strip_prefix(&root).unwrap_or(file).to_owned());
            }
        }
    }
    graph
}

/// A cycle of the graph, as the modules along it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        graph: &Graph,
        node: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| n == node).expect("on the path");
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
            if let Some(cycle) = visit(graph, next, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut marks, &mut Vec::new()))
}

#[test]
fn the_library_modules_import_no_cycle() {
    let graph = graph();
    assert!(
        graph.len() > 20,
        "too few modules found: {:?}",
        graph.keys()
    );
    if let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> = cycle
            .windows(2)
            .map(|pair| {
                format!(
                    "{} -> {} ({:?})",
                    pair[0], pair[1], graph[&pair[0]][&pair[1]]
                )
            })
            .collect();
        panic!(
            "an import cycle between the library's modules:\n  {}\nbreak it: DESIGN.md's layer \
             diagram says which way each layer may point",
            steps.join("\n  ")
        );
    }
}

/// The checker finds a cycle where there is one, so that the test above can fail.
#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        graph
            .entry(from.to_owned())
            .or_default()
            .insert(to.to_owned(), PathBuf::from(format!("{from}.rs")));
        graph.entry(to.to_owned()).or_default();
    }
    let cycle = find_cycle(&graph).expect("a -> b -> c -> a is a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4, "{cycle:?}");
    graph.get_mut("c").unwrap().remove("a");
    assert_eq!(find_cycle(&graph), None);
    assert_eq!(
        named_modules("use crate::{a::{B, x}, c};\nlet y = crate::d::e();"),
        ["a", "c", "d"].map(String::from).into()
    );
    let reexports = root_reexports("pub use crate::a::{B, C as D};\npub use crate::e::F;");
    assert_eq!(reexports.get("D").map(String::as_str), Some("a"));
    assert_eq!(reexports.get("F").map(String::as_str), Some("e"));
    assert_eq!(reexports.get("C"), None);
}

/// The top-level modules that are backends: those that give the registry a `Driver`
/// (`crate::driver::driver!` declares it).
fn backend_modules(root: &Path, files: &[PathBuf]) -> BTreeSet<String> {
    files
        .iter()
        .filter(|file| {
            std::fs::read_to_string(file).is_ok_and(|text| text.contains("crate::driver::driver!("))
        })
        .filter_map(|file| module_of(root, file))
        .filter(|module| module != "driver")
        .collect()
}

/// The places in `line` that decide something by a scheme's name: a comparison, a match arm,
/// or a prefix test, strip or rewrite of a URL.
fn scheme_matches(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    for scheme in distlock::SCHEMES {
        let name = scheme.name;
        let mut patterns = vec![
            format!("== \"{name}\""),
            format!("!= \"{name}\""),
            format!("\"{name}\" =="),
            format!("\"{name}\" !="),
            format!("\"{name}\" =>"),
            format!("\"{name}\" |"),
            format!("| \"{name}\""),
            format!("== Some(\"{name}\")"),
            format!("((\"{name}\","),
        ];
        for call in [
            "starts_with(",
            "strip_prefix(",
            "replacen(",
            "split_once(",
            "eq(",
            "ends_with(",
        ] {
            for after in ["\"", ":", "+"] {
                patterns.push(format!("{call}\"{name}{after}"));
            }
        }
        found.extend(
            patterns
                .into_iter()
                .filter(|pattern| line.contains(pattern.as_str())),
        );
    }
    found
}

/// Code outside a backend's folder, the registry and the stock module's per-server stores
/// asks the registry (`SCHEMES`, the drivers) instead of deciding by a scheme's name, in the library and in the command line. Adding a backend then touches its folder and the lists, not the code
/// that uses them.
#[test]
fn only_backends_and_the_registry_name_schemes() {
    let root = source_root();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let backends = backend_modules(&root, &files);
    assert!(
        backends.len() >= 7 && backends.contains("redis") && backends.contains("memory"),
        "the backends were not found by their Driver impls: {backends:?}"
    );
    let registry = ["scheme"];
    // The stock module's stores, one file per server, are the stock module's backends.
    let stores = root.join("stock/stores");
    let cli = root.join("../../distlock-cli/src");
    let cli = cli
        .canonicalize()
        .unwrap_or_else(|e| panic!("the CLI's sources are not at {cli:?}: {e}"));
    rust_files(&cli, &mut files);
    let mut offences = Vec::new();
    for file in &files {
        let module = file
            .starts_with(&root)
            .then(|| module_of(&root, file))
            .flatten();
        if module
            .as_ref()
            .is_some_and(|m| backends.contains(m) || registry.contains(&m.as_str()))
            || file.starts_with(&stores)
        {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("read {file:?}: {e}"));
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for found in scheme_matches(line) {
                offences.push(format!("{}:{}: {found}", file.display(), number + 1));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "code outside a backend's folder decides by a scheme name; ask the \
         registry (a `Scheme` field, the backend's `Driver`, a `Backend` method) instead:\n  {}",
        offences.join("\n  ")
    );
}

/// The scan above sees each form it forbids, so that it can fail.
#[test]
fn the_scheme_scan_sees_each_form() {
    for line in [
        r#"if url.starts_with("redis://") {"#,
        r#"match scheme { "zk" => 1, _ => 2 }"#,
        r#"Some("postgres" | "mysql") => 3,"#,
        r#"if name == "etcd" {"#,
        r#"url.strip_prefix("memory:")"#,
        r#"Some(("mariadb", _)) => "mysql".to_owned(),"#,
        r#"if "zk" == scheme {"#,
        r#"if name.eq("sqlite") {"#,
    ] {
        assert!(!scheme_matches(line).is_empty(), "not seen: {line}");
    }
    for line in [
        r#"default_value = "zk://127.0.0.1:2181/""#,
        r#"names: ["redis", "redis-spin"]"#,
    ] {
        assert!(scheme_matches(line).is_empty(), "wrongly seen: {line}");
    }
}
