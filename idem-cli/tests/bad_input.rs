//! Bad input to the `idem` command: each case gets a precise error (file, and line where
//! the parser gives one), exit code 1 (2 for usage errors), and nothing written: an
//! existing output file keeps its contents, a new one is not created.

mod common;

use std::path::{Path, PathBuf};

use common::{fixture, idem, stderr};

const SENTINEL: &str = "the output before the failed run\n";

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Case {
        Case {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn file(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs `idem merge` of the pet store contract into `spec`, with an output file that
    /// exists beforehand; returns the exit code and stderr, and checks nothing was
    /// written.
    fn merge_fails(&self, spec: &Path, extra: &[&str]) -> String {
        let out = self.file("out.yaml", SENTINEL);
        let schema = self.path("schema.json");
        let src = fixture("src/pets.rs");
        let mut args = vec![
            "merge",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--schema-out",
            schema.to_str().unwrap(),
        ];
        if !extra.contains(&"--contracts") {
            args.extend([
                "--src",
                src.to_str().unwrap(),
                "--target",
                "addPet=POST /pets",
            ]);
        }
        args.extend_from_slice(extra);
        let run = idem(&args, self.dir.path());
        let err = stderr(&run);
        assert_eq!(run.status.code(), Some(1), "exit code; stderr:\n{err}");
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            SENTINEL,
            "the output was touched"
        );
        assert!(!schema.exists(), "the schema was written");
        let leftovers: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".idem-"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files were left behind");
        err
    }
}

fn petstore() -> String {
    std::fs::read_to_string(common::data_dir().join("petstore-expanded.3.0.yaml")).unwrap()
}

#[test]
fn malformed_yaml_names_file_and_line() {
    let case = Case::new();
    let spec = case.file(
        "bad.yaml",
        "openapi: 3.0.3\ninfo:\n  title: x\n   version: 1\npaths: {}\n",
    );
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("bad.yaml:4:") && err.contains(": error: invalid YAML: "),
        "{err}"
    );
}

#[test]
fn malformed_json_names_file_and_line() {
    let case = Case::new();
    let spec = case.file(
        "bad.json",
        "{\n  \"openapi\": \"3.0.3\",\n  \"paths\": {\n    \"/a\": {,}\n  }\n}\n",
    );
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("bad.json:4:12: error: invalid JSON: key must be a string"),
        "{err}"
    );
}

#[test]
fn duplicate_keys_are_refused() {
    let case = Case::new();
    let spec = case.file(
        "dup.json",
        "{\"openapi\": \"3.0.3\",\n\"paths\": {}, \"paths\": {}}",
    );
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("dup.json:2:") && err.contains("the key `paths` is given twice"),
        "{err}"
    );
}

#[test]
fn empty_file() {
    let case = Case::new();
    let spec = case.file("empty.yaml", "");
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("empty.yaml: error: the file is empty"),
        "{err}"
    );
}

#[test]
fn non_utf8_file() {
    let case = Case::new();
    let spec = case.file("latin1.yaml", b"openapi: 3.0.3\ninfo:\n  title: Caf\xe9\n");
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("latin1.yaml:3:13: error: the file is not UTF-8 text (byte 0xe9"),
        "{err}"
    );
}

#[test]
fn deeply_nested_documents_are_refused_without_crashing() {
    let case = Case::new();
    let deep = format!(
        "openapi: 3.0.3\nx: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let spec = case.file("deep.yaml", deep);
    let err = case.merge_fails(&spec, &[]);
    assert!(err.contains("deep.yaml:2:1004: error: invalid YAML: flow collections are nested deeper than 1000 levels"), "{err}");
    // Deeper than the deserializer's limit but not the scanner's guard: refused by serde.
    let spec = case.file(
        "deep2.yaml",
        format!(
            "openapi: 3.0.3\nx: {}{}\n",
            "[".repeat(500),
            "]".repeat(500)
        ),
    );
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("deep2.yaml:2:") && err.contains("recursion limit exceeded"),
        "{err}"
    );
    let block: String = (0..300)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    let spec = case.file("deep3.yaml", format!("openapi: 3.0.3\n{block}"));
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("deep3.yaml:") && err.contains("recursion limit exceeded"),
        "{err}"
    );
    let deep = format!(
        "{{\"openapi\": \"3.0.3\", \"x\": {}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let spec = case.file("deep.json", deep);
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("deep.json:1:") && err.contains("recursion limit exceeded"),
        "{err}"
    );
}

#[test]
fn alias_bombs_are_refused() {
    let case = Case::new();
    let mut bomb = String::from("openapi: 3.0.3\na: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (name, prev) in ["b", "c", "d", "e", "f", "g", "h", "i", "j"]
        .into_iter()
        .zip(["a", "b", "c", "d", "e", "f", "g", "h", "i"])
    {
        let refs = vec![format!("*{prev}"); 10].join(", ");
        bomb.push_str(&format!("{name}: &{name} [{refs}]\n"));
    }
    let spec = case.file("bomb.yaml", bomb);
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("bomb.yaml") && err.contains("repetition limit exceeded"),
        "{err}"
    );
}

#[test]
fn huge_file_is_refused_before_it_is_read_whole() {
    let case = Case::new();
    let spec = case.path("huge.yaml");
    let file = std::fs::File::create(&spec).unwrap();
    file.set_len(idem_codegen::io::MAX_INPUT_BYTES + 1).unwrap();
    drop(file);
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("huge.yaml: error: the file is larger than 128 MiB"),
        "{err}"
    );
}

#[test]
fn swagger_2_is_named() {
    let case = Case::new();
    let spec = case.file(
        "swagger.yaml",
        "swagger: '2.0'\ninfo: {title: x, version: '1'}\npaths: {}\n",
    );
    let err = case.merge_fails(&spec, &[]);
    assert!(err.contains("swagger.yaml:1:1: error: this is a Swagger 2.0 document; idem merges into OpenAPI 3.0 and 3.1 only"), "{err}");
}

#[test]
fn not_openapi_at_all() {
    let case = Case::new();
    let spec = case.file("list.yaml", "- a\n- b\n");
    let err = case.merge_fails(&spec, &[]);
    assert!(
        err.contains("list.yaml: error: not an OpenAPI document"),
        "{err}"
    );
}

#[test]
fn a_target_that_matches_nothing() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let err = case.merge_fails(&spec, &["--target", "addPet=addPets"]);
    assert!(
        err.contains("pets.rs:8:1: error: `addPet` targets `addPets`, which"),
        "{err}"
    );
    assert!(err.contains("petstore.yaml does not have: no operation has the operationId `addPets` (did you mean `addPet`?)"), "{err}");
    // The error says how to name the operation the contract describes.
    assert!(
        err.contains("help: name the operation it describes with `--target NAME=TARGET`: `--target addPet=OPERATION_ID`, `--target addPet=\"METHOD /path\"`"),
        "{err}"
    );
    let err = case.merge_fails(&spec, &["--target", "addPet=PUT /pets"]);
    assert!(
        err.contains("the path `/pets` has no `put` operation; it has `get`, `post`"),
        "{err}"
    );
    let err = case.merge_fails(&spec, &["--target", "addPet=POST webhook newPet"]);
    assert!(
        err.contains("webhooks are an OpenAPI 3.1 feature and this document is OpenAPI 3.0.0"),
        "{err}"
    );
    // A contracts file may name the target in its entry too.
    let file = case.file(
        "c.json",
        std::fs::read_to_string(fixture("stripe.contracts.json")).unwrap(),
    );
    let err = case.merge_fails(&spec, &["--contracts", file.to_str().unwrap()]);
    assert!(
        err.contains("c.json: error: contract 1: `create_charge` targets `PostCharges`")
            && err
                .contains("`--target NAME=TARGET` (or the entry's `target` in the contracts file)"),
        "{err}"
    );
    // `idem docs --spec` says the same.
    let run = idem(
        &[
            "docs",
            "--spec",
            spec.to_str().unwrap(),
            "--src",
            fixture("src/pets.rs").to_str().unwrap(),
            "--target",
            "addPet=addPets",
            "--out",
            case.path("site").to_str().unwrap(),
        ],
        case.dir.path(),
    );
    assert_eq!(run.status.code(), Some(1));
    assert!(
        stderr(&run).contains("`--target NAME=TARGET`"),
        "{}",
        stderr(&run)
    );
}

#[test]
fn the_default_target_is_the_handler_name() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let out = case.file("out.yaml", SENTINEL);
    let src = fixture("src/pets.rs");
    // Without --target, `addPet` is looked up as an operationId, which the pet store has.
    let run = idem(
        &[
            "merge",
            "--spec",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--src",
            src.to_str().unwrap(),
        ],
        case.dir.path(),
    );
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .contains("x-idempotency:")
    );
}

#[test]
fn two_contracts_on_one_operation() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let hooks = fixture("src/webhooks.rs");
    let err = case.merge_fails(
        &spec,
        &[
            "--src",
            hooks.to_str().unwrap(),
            "--target",
            "new_pet=addPet",
        ],
    );
    assert!(
        err.contains("webhooks.rs:7:1: error: `new_pet` and `addPet` both describe `POST /pets`"),
        "{err}"
    );
}

#[test]
fn an_unknown_operation_in_target() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let err = case.merge_fails(&spec, &["--target", "add_pet=addPet"]);
    assert!(err.contains("error: `--target add_pet=addPet`: no contract has the operation `add_pet`; the operations are `addPet`"), "{err}");
}

fn contracts_file(case: &Case, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let text = std::fs::read_to_string(fixture("stripe.contracts.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    case.file("contracts.json", serde_json::to_string_pretty(&v).unwrap())
}

#[test]
fn a_contracts_file_with_an_unknown_field() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let file = contracts_file(&case, |v| {
        v["contracts"][0]["contract"]["ttll"] = "24h".into()
    });
    let err = case.merge_fails(&spec, &["--contracts", file.to_str().unwrap()]);
    let text = std::fs::read_to_string(&file).unwrap();
    let line = text.lines().position(|l| l.contains("\"ttll\"")).unwrap() + 1;
    assert!(err.contains(&format!("contracts.json:{line}:")), "{err}");
    assert!(err.contains("error: not a contracts file: unknown field `ttll`, expected one of `operation`, `key_scope`"), "{err}");
}

#[test]
fn a_contracts_file_with_a_bad_duration() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let file = contracts_file(&case, |v| {
        v["contracts"][1]["contract"]["ttl"] = "24 parsecs".into()
    });
    let err = case.merge_fails(&spec, &["--contracts", file.to_str().unwrap()]);
    assert!(
        err.contains("contracts.json:")
            && err.contains("`24 parsecs` is not a duration: write a whole number and a unit"),
        "{err}"
    );
}

#[test]
fn a_contracts_file_that_breaks_the_rules_lists_every_violation() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let file = contracts_file(&case, |v| {
        v["contracts"][0]["contract"]["ttl"] = "10s".into();
        v["contracts"][0]["contract"]["retryable"] = serde_json::json!([404, 503]);
        v["contracts"][2]["contract"]["max_attempts"] = 0.into();
    });
    let err = case.merge_fails(&spec, &["--contracts", file.to_str().unwrap()]);
    assert!(err.contains("contracts.json: error: contract 1: `create_charge`, `ttl`: `ttl` (10s) is shorter than `deadline` (30s)"), "{err}");
    assert!(err.contains("contracts.json: error: contract 1: `create_charge`, `retryable[0]`: `404` (Not Found) is a permanent answer"), "{err}");
    assert!(err.contains("contracts.json: error: contract 3: `create_payment_intent`, `max_attempts`: `max_attempts` counts the first attempt too"), "{err}");
}

#[test]
fn a_source_file_that_does_not_parse() {
    let case = Case::new();
    let src = case.file(
        "broken.rs",
        "#[idem::contract(ttl = \"24h\")]\npub async fn f() {\n    let x = ;\n}\n",
    );
    let run = idem(&["check", "--src", src.to_str().unwrap()], case.dir.path());
    let err = stderr(&run);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains("broken.rs:3:13: error: the file is not valid Rust: expected an expression"),
        "{err}"
    );
    let src = case.file("unclosed.rs", "fn f() {\n    \"unterminated\n}\n");
    let run = idem(&["check", "--src", src.to_str().unwrap()], case.dir.path());
    assert_eq!(run.status.code(), Some(1));
    assert!(
        stderr(&run).contains("unclosed.rs:2:5: error: the file is not valid Rust"),
        "{}",
        stderr(&run)
    );
}

#[test]
fn hostile_source_is_refused_without_crashing() {
    let case = Case::new();
    let deep = format!(
        "fn f() {{ {}1{} }}\n",
        "(".repeat(50_000),
        ")".repeat(50_000)
    );
    let src = case.file("deep.rs", deep);
    let run = idem(&["check", "--src", src.to_str().unwrap()], case.dir.path());
    assert_eq!(run.status.code(), Some(1));
    assert!(
        stderr(&run).contains("deep.rs:1:")
            && stderr(&run).contains("nested deeper than 256 levels"),
        "{}",
        stderr(&run)
    );
    let unary = format!("fn f() {{ let x = {}1; }}\n", "- ".repeat(100_000));
    let src = case.file("unary.rs", unary);
    let run = idem(&["check", "--src", src.to_str().unwrap()], case.dir.path());
    assert_eq!(run.status.code(), Some(1));
    assert!(
        stderr(&run).contains("more than 256 operator characters in a row"),
        "{}",
        stderr(&run)
    );
}

#[test]
fn usage_errors_exit_with_2() {
    let case = Case::new();
    for args in [
        &["merge", "--src", "x"][..],
        &["merge", "--spec", "a.yaml"][..],
        &[
            "merge", "--spec", "a.yaml", "--src", "x", "--target", "nonsense",
        ][..],
        &["docs", "--src", "x"][..],
        &["docs", "--src", "x", "--out", "d", "--format", "pdf"][..],
        &["frobnicate"][..],
        &[][..],
    ] {
        let run = idem(args, case.dir.path());
        assert_eq!(run.status.code(), Some(2), "{args:?}: {}", stderr(&run));
    }
    let run = idem(
        &[
            "merge",
            "--spec",
            "a.yaml",
            "--src",
            "x",
            "--target",
            "a=FETCH /x",
        ],
        case.dir.path(),
    );
    assert!(
        stderr(&run).contains("`FETCH /x` is not an operation"),
        "{}",
        stderr(&run)
    );
}

#[test]
fn missing_inputs_are_named() {
    let case = Case::new();
    let spec = case.file("petstore.yaml", petstore());
    let err = case.merge_fails(&spec, &["--contracts", "nope.json"]);
    assert!(
        err.contains("nope.json: error: cannot read the file"),
        "{err}"
    );
    let run = idem(&["check", "--src", "no/such/dir"], case.dir.path());
    assert_eq!(run.status.code(), Some(1));
    assert!(
        stderr(&run).contains("no/such/dir: error: cannot read"),
        "{}",
        stderr(&run)
    );
}

/// `--identity-header` takes an HTTP header name (RFC 9110 §5.1): empty, spaced, with a
/// colon, non-ASCII or a control character is a usage error that names the value, and
/// nothing is written.
#[test]
fn a_malformed_identity_header_is_a_usage_error() {
    let case = Case::new();
    for name in [
        "",
        "   ",
        "x client",
        "x-client:",
        "x-clïent",
        "x\u{7f}client",
    ] {
        for command in ["merge", "docs"] {
            let run = idem(
                &[
                    command,
                    "--spec",
                    "a.yaml",
                    "--src",
                    "src",
                    "--out",
                    "out",
                    "--identity-header",
                    name,
                ],
                case.dir.path(),
            );
            assert_eq!(run.status.code(), Some(2), "{name:?}: {}", stderr(&run));
            assert!(
                stderr(&run).contains("is not a header name"),
                "{name:?}: {}",
                stderr(&run)
            );
            assert!(!case.dir.path().join("out").exists(), "{name:?}");
        }
    }
}
