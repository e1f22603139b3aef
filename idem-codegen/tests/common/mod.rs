//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The folder of the real OpenAPI documents (never edited: tests copy them).
pub fn data_dir() -> PathBuf {
    let beside_repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/openapi");
    for dir in [beside_repo, PathBuf::from("/work/shared/data/openapi")] {
        if dir.join("petstore-expanded.3.0.yaml").is_file() {
            return dir;
        }
    }
    panic!("the real OpenAPI documents (shared/data/openapi beside the repository) are missing");
}

/// A fixture of this crate's `tests/fixtures`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A temporary folder holding a copy of the real document `name`.
pub fn copy_of(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::copy(data_dir().join(name), &path).unwrap();
    (dir, path)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether the Python OpenAPI validator is installed. When it is not, a notice is printed
/// and the caller skips the step, unless `IDEM_REQUIRE_VALIDATOR=1` (set by CI), which
/// makes the missing validator a failure.
pub fn validator_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import openapi_spec_validator, yaml"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("IDEM_REQUIRE_VALIDATOR").as_deref() == Ok("1") {
            panic!(
                "IDEM_REQUIRE_VALIDATOR=1 but `python3 -m openapi_spec_validator` is not installed (pip install openapi-spec-validator)"
            );
        }
        eprintln!(
            "\n********************************************************************\n\
             NOTICE: python3 -m openapi_spec_validator is not installed; the\n\
             independent validation step is SKIPPED. Install it with\n\
             `pip install openapi-spec-validator` (CI sets IDEM_REQUIRE_VALIDATOR=1).\n\
             ********************************************************************\n"
        );
    }
    ok
}

/// Validates `path` with the independent Python validator, if installed.
pub fn validate(path: &Path) {
    if !validator_available() {
        return;
    }
    let out = Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openapi-spec-validator refused {}:\n{}{}",
        path.display(),
        stdout(&out),
        stderr(&out)
    );
}

/// The document at `path` as PyYAML (YAML 1.1) reads it, as JSON, when Python is
/// available.
pub fn read_with_pyyaml(path: &Path) -> Option<serde_json::Value> {
    if !validator_available() {
        return None;
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml\nprint(json.dumps(yaml.load(open(sys.argv[1], encoding='utf-8'), Loader=getattr(yaml, 'CSafeLoader', yaml.SafeLoader))))",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "PyYAML could not read {}: {}",
        path.display(),
        stderr(&out)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// What the Python `jsonschema` package (a dependency of the OpenAPI validator) finds
/// wrong with `instance` under the JSON Schema (draft 2020-12) `schema`: `Some("")` when
/// nothing, `None` when it is not installed (as [`validator_available`] decides).
pub fn schema_errors(schema: &serde_json::Value, instance: &serde_json::Value) -> Option<String> {
    schema_errors_each(schema, std::slice::from_ref(instance)).map(|mut each| each.remove(0))
}

/// [`schema_errors`] of each of `instances`, in their order, from one run of Python.
pub fn schema_errors_each(
    schema: &serde_json::Value,
    instances: &[serde_json::Value],
) -> Option<Vec<String>> {
    if !validator_available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (s, i) = (
        dir.path().join("schema.json"),
        dir.path().join("instances.json"),
    );
    std::fs::write(&s, schema.to_string()).unwrap();
    std::fs::write(&i, serde_json::Value::from(instances.to_vec()).to_string()).unwrap();
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, sys, jsonschema\nschema = json.load(open(sys.argv[1]))\njsonschema.Draft202012Validator.check_schema(schema)\nvalidator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())\nprint(json.dumps(['\\n'.join(e.message for e in validator.iter_errors(i)) for i in json.load(open(sys.argv[2]))]))",
        ])
        .arg(&s)
        .arg(&i)
        .output()
        .unwrap();
    assert!(out.status.success(), "jsonschema failed: {}", stderr(&out));
    let each: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(each.len(), instances.len(), "one answer an instance");
    Some(each)
}

/// Checks that `instance` is valid under `schema` ([`schema_errors`]).
pub fn assert_schema_valid(schema: &serde_json::Value, instance: &serde_json::Value) {
    if let Some(errors) = schema_errors(schema, instance) {
        assert!(
            errors.is_empty(),
            "{instance} is not valid under the schema:\n{errors}"
        );
    }
}
