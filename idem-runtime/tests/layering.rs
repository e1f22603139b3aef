//! The runtime reads one way (STYLE.md, "Dependencies run one way"): a request goes
//! layer → enforcement → store and back, and no module imports one that imports it.
//!
//! This test reads the crate's own sources and checks every `crate::<module>` path
//! against the order below: a module may name only the modules before it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The modules from the bottom up.
const ORDER: &[&str] = &[
    "operation_id",
    "store",
    "problem",
    "telemetry",
    "identity",
    "fault",
    "fingerprint",
    "reconcile",
    "operation",
    "wire",
    "idem",
    "answer",
    "replay",
    "transaction",
    "attempt",
    "recovery",
    "enforce",
    "lookup",
    "layer",
];

/// The files of module `name` (a file, or a folder of files).
fn files(src: &Path, name: &str) -> Vec<PathBuf> {
    let file = src.join(format!("{name}.rs"));
    if file.is_file() {
        return vec![file];
    }
    let mut out = Vec::new();
    let mut dirs = vec![src.join(name)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}

/// The code of a file without comments and without its `#[cfg(test)]` module.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The items the crate root re-exports, by the module they come from
/// (`crate::Idem` is the `idem` module).
fn root_items(lib: &str) -> BTreeMap<String, String> {
    let mut items = BTreeMap::new();
    for statement in lib.split(';') {
        let Some(rest) = statement.trim().rsplit("pub use crate::").next() else {
            continue;
        };
        if !statement.contains("pub use crate::") {
            continue;
        }
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        for name in names.trim_matches(|c| c == '{' || c == '}').split(',') {
            let name = name.trim();
            if !name.is_empty() {
                items.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    items
}

fn first_segment(path: &str) -> String {
    path.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

#[test]
fn every_module_imports_only_from_the_modules_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let items = root_items(&code(&lib));
    assert!(items.get("Idem").is_some_and(|m| m == "idem"), "{items:?}");
    for module in ORDER {
        assert!(
            lib.contains(&format!("mod {module};")),
            "`{module}` is not a module of the crate: update ORDER"
        );
    }
    let mut broken = Vec::new();
    for (rank, module) in ORDER.iter().enumerate() {
        for file in files(&src, module) {
            let text = code(&std::fs::read_to_string(&file).unwrap());
            for (at, _) in text.match_indices("crate::") {
                let rest = &text[at + "crate::".len()..];
                // `crate::{a, b::c}` names every first segment inside the braces.
                let names: Vec<String> = match rest.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap_or(group.len())]
                        .split(',')
                        .map(|path| first_segment(path.trim()))
                        .collect(),
                    None => vec![first_segment(rest)],
                };
                for name in names {
                    let target = items.get(&name).cloned().unwrap_or(name.clone());
                    let Some(target_rank) = ORDER.iter().position(|m| *m == target) else {
                        continue;
                    };
                    if target_rank > rank {
                        broken.push(format!(
                            "{} names `crate::{name}` (module `{target}`), which is above `{module}`",
                            file.strip_prefix(&src).unwrap().display()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports against the grain:\n{}",
        broken.join("\n")
    );
}
