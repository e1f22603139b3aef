//! The runtime reads one way: a request goes layer → enforcement → store and back, and no
//! module imports one that imports it. So does the workspace: each crate depends only on
//! the crates below it.
//!
//! The first test reads the crate's own sources and checks every `crate::<module>` path
//! against the order below: a module may name only the modules before it. The second
//! reads every crate's manifest and checks its dependencies on the workspace's crates
//! against [`CRATES`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The modules from the bottom up.
const ORDER: &[&str] = &[
    "header",
    "operation_id",
    "store",
    "problem",
    "telemetry",
    "identity",
    "fault",
    "fingerprint",
    "reconcile",
    "operation",
    "serde_names",
    "idem",
    "answer",
    "replay",
    "transaction",
    "mode",
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

/// Which of the workspace's crates each may depend on (normal and build dependencies),
/// from the bottom up: the contract is plain data; the macro, the runtime, the published
/// side and the client each stand on it alone; the harness on the runtime (and the
/// client); the command on the published side, the runtime and the harness; the facade
/// on all of them.
const CRATES: &[(&str, &[&str])] = &[
    ("idem-contract", &[]),
    ("idem-macros", &["idem-contract"]),
    ("idem-runtime", &["idem-contract"]),
    ("idem-codegen", &["idem-contract"]),
    ("idem-client", &["idem-contract"]),
    (
        "idem-testing",
        &["idem-contract", "idem-runtime", "idem-client"],
    ),
    (
        "idem-cli",
        &[
            "idem-contract",
            "idem-codegen",
            "idem-runtime",
            "idem-testing",
        ],
    ),
    (
        "idem",
        &[
            "idem-contract",
            "idem-macros",
            "idem-runtime",
            "idem-codegen",
            "idem-client",
            "idem-testing",
        ],
    ),
];

/// The workspace's crates a manifest names, by section kind: `(normal and build, dev)`.
/// Reads `[dependencies]`, `[build-dependencies]`, `[dev-dependencies]` and their
/// `[target.….…]` forms (not `[workspace.dependencies]`); a renamed dependency counts
/// under its `package`.
fn workspace_dependencies(manifest: &str) -> (Vec<String>, Vec<String>) {
    let (mut normal, mut dev) = (Vec::new(), Vec::new());
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_owned();
            continue;
        }
        // The root's `[workspace.dependencies]` declares versions, not dependencies.
        let kind = match section.as_str() {
            "workspace.dependencies" => "",
            _ => section.rsplit('.').next().unwrap_or(""),
        };
        let list = match kind {
            "dependencies" | "build-dependencies" => &mut normal,
            "dev-dependencies" => &mut dev,
            _ => continue,
        };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let name = match value.split_once("package") {
            Some((_, rest)) => rest
                .trim_start_matches([' ', '='])
                .trim_start_matches('"')
                .split('"')
                .next()
                .unwrap_or("")
                .to_owned(),
            None => key.trim().split('.').next().unwrap_or("").to_owned(),
        };
        if name == "idem" || name.starts_with("idem-") {
            list.push(name);
        }
    }
    (normal, dev)
}

#[test]
fn every_crate_depends_only_on_the_crates_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut broken = Vec::new();
    for (name, allowed) in CRATES {
        let dir = if *name == "idem" {
            root.clone()
        } else {
            root.join(name)
        };
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name}: not the manifest of {name}"
        );
        let (normal, dev) = workspace_dependencies(&manifest);
        for dependency in &normal {
            if !allowed.contains(&dependency.as_str()) {
                broken.push(format!("{name} depends on {dependency}"));
            }
        }
        // The published side never reaches the runtime, not even in its tests: the
        // command's tests, which need stores, live in idem-cli.
        if *name == "idem-codegen" {
            for dependency in &dev {
                if ["idem-runtime", "idem-testing", "idem-cli", "idem"]
                    .contains(&dependency.as_str())
                {
                    broken.push(format!("idem-codegen dev-depends on {dependency}"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "dependencies against the grain:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_manifest_reader_finds_renamed_and_target_dependencies() {
    let manifest = "[package]\nname = \"x\"\n\n[dependencies]\nidem-contract.workspace = true\nserde = \"1\"\nrt = { package = \"idem-runtime\", path = \"../idem-runtime\" }\n\n[target.'cfg(unix)'.dependencies]\nidem-client = { workspace = true }\n\n[dev-dependencies]\nidem = { path = \"..\" }\n\n[workspace.dependencies]\nidem-cli = \"1\"\n\n[features]\nidem-x = []\n";
    let (normal, dev) = workspace_dependencies(manifest);
    assert_eq!(normal, ["idem-contract", "idem-runtime", "idem-client"]);
    assert_eq!(dev, ["idem"]);
}

/// The stages of the request path in `enforce/`, in the order a request passes them (the
/// table of `enforce`'s module docs), after the rejection they answer with. A stage may
/// name only the stages before it; `enforce/mod.rs` composes them.
const STAGES: &[&str] = &[
    "rejection",
    "admit",
    "key",
    "read",
    "significant",
    "look",
    "inner",
    "begin",
    "register",
];

/// The stage a name reached through `super::` or `crate::enforce::` belongs to.
fn stage_of(name: &str) -> Option<&'static str> {
    if name == "Rejection" {
        return Some("rejection");
    }
    STAGES.iter().copied().find(|stage| *stage == name)
}

#[test]
fn each_stage_of_the_request_path_names_only_the_stages_before_it() {
    let enforce = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/enforce");
    let mut listed = Vec::new();
    for entry in std::fs::read_dir(&enforce).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name != "mod" {
            listed.push(name);
        }
    }
    for name in &listed {
        assert!(
            STAGES.contains(&name.as_str()),
            "`enforce/{name}` is not a stage of the request path: add it to STAGES in its place"
        );
    }
    let mut broken = Vec::new();
    for (rank, stage) in STAGES.iter().enumerate() {
        for file in files(&enforce, stage) {
            let text = code(&std::fs::read_to_string(&file).unwrap());
            let top_level = file.parent() == Some(enforce.as_path());
            let mut prefixes = vec!["crate::enforce::"];
            if top_level {
                prefixes.push("super::");
            }
            for prefix in prefixes {
                for (at, _) in text.match_indices(prefix) {
                    let name = first_segment(&text[at + prefix.len()..]);
                    let Some(target) = stage_of(&name) else {
                        continue;
                    };
                    let target_rank = STAGES.iter().position(|s| *s == target).unwrap();
                    if target_rank > rank {
                        broken.push(format!(
                            "enforce/{} names `{prefix}{name}` (stage `{target}`), which comes after `{stage}`",
                            file.strip_prefix(&enforce).unwrap().display()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "stages against the grain:\n{}",
        broken.join("\n")
    );
}

/// The request path's modules: their functions switch on no feature inside a body (a
/// mode that exists only with some features is a type defined in every feature set, its
/// unavailable arm uninhabited: `mode::Mode`, `fault::TestFault`).
const REQUEST_PATH: &[&str] = &[
    "enforce",
    "mode",
    "attempt",
    "recovery",
    "lookup",
    "transaction",
];

#[test]
fn no_function_of_the_request_path_switches_on_a_feature_inside_its_body() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for module in REQUEST_PATH {
        for file in files(&src, module) {
            let text = code(&std::fs::read_to_string(&file).unwrap());
            for line in text.lines() {
                let indented = line.starts_with(char::is_whitespace);
                let attribute = line.trim_start().starts_with("#[cfg");
                if (indented && attribute && !line.contains("cfg(test)")) || line.contains("cfg!(")
                {
                    found.push(format!(
                        "{}: {}",
                        file.strip_prefix(&src).unwrap().display(),
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a feature switch inside the request path (make the mode a type defined in every feature set):\n{}",
        found.join("\n")
    );
}
