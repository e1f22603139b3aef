//! Consumer docs: one section per contracted operation with the nine
//! properties in plain words, how to retry it safely, what each answer means, and a
//! worked request sequence; in Markdown, or as one self-contained HTML file (inline CSS,
//! no external assets).
//!
//! The templates are files in `idem-codegen/templates/`, rendered with minijinja. The
//! HTML template is named `docs.html`, so minijinja escapes every value in it; Markdown
//! values go through the `markdown` filter, which puts user values in code spans that
//! hold any character.

mod answers;
mod content;
mod diagram;
mod properties;
mod rich;

use minijinja::value::{Serde, Value};
use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

use idem_contract::Contract;

pub use content::{Answer, HeaderExample, OperationInfo, PropertyText, Section, Step};
pub use diagram::{Arrow, Diagram, Lane, Note, Text};
pub use rich::{Rich, Span};

use crate::problem::ProblemType;

const MARKDOWN: &str = include_str!("../../templates/docs.md");
const HTML: &str = include_str!("../../templates/docs.html");

/// The formats of the consumer docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DocFormat {
    /// `operations.md`.
    Markdown,
    /// `operations.html`, self-contained.
    Html,
}

impl DocFormat {
    /// The file name the `idem docs` command writes.
    pub const fn file_name(self) -> &'static str {
        match self {
            DocFormat::Markdown => "operations.md",
            DocFormat::Html => "operations.html",
        }
    }
}

/// One problem type in the reference table.
#[derive(Serialize)]
struct ProblemRow {
    uri: String,
    status: u16,
    title: &'static str,
}

#[derive(Serialize)]
struct Page<'a> {
    title: &'a str,
    operations: Vec<Section>,
    problems: Vec<ProblemRow>,
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid"),
    );
    env.add_filter("markdown", |spans: Serde<Vec<Span>>| {
        rich::markdown(&spans, false)
    });
    env.add_filter("markdown_cell", |spans: Serde<Vec<Span>>| {
        rich::markdown(&spans, true)
    });
    env.add_filter("code", |s: String| rich::code_span(&s));
    // Text idem did not write (a spec's title, a summary, a route): escaped as the HTML
    // template's autoescape escapes it.
    env.add_filter("literal", |s: String| rich::literal(&s));
    // A problem type URI in two pieces that are never broken: its prefix up to the
    // last `:` and its slug, so that a narrow column wraps it only between them.
    env.add_filter("type_parts", |s: String| match s.rfind(':') {
        Some(i) if i + 1 < s.len() => vec![s[..=i].to_owned(), s[i + 1..].to_owned()],
        _ => vec![s],
    });
    env.add_filter("fence", |s: String| rich::block_fence(&s));
    env.add_template("docs.md", MARKDOWN)
        .expect("the Markdown template parses");
    env.add_template("docs.html", HTML)
        .expect("the HTML template parses");
    env
}

/// Renders the docs of `operations` (each contract with what is known of its route) in
/// `format`, under the page title `title`.
///
/// # Errors
///
/// A template error; the templates are fixed, so this is a bug in idem, reported rather
/// than panicking.
pub fn render(
    format: DocFormat,
    title: &str,
    operations: &[(Contract, OperationInfo)],
) -> Result<String, crate::Error> {
    let mut sections: Vec<Section> = operations
        .iter()
        .map(|(c, info)| content::section(c, info))
        .collect();
    // Two operations may make the same anchor (`POST /a-b` and `POST /a_b`): number the
    // later ones.
    for i in 1..sections.len() {
        let mut n = 2;
        let base = sections[i].anchor.clone();
        while sections[..i].iter().any(|s| s.anchor == sections[i].anchor) {
            sections[i].anchor = format!("{base}-{n}");
            n += 1;
        }
    }
    let page = Page {
        title,
        operations: sections,
        problems: ProblemType::ALL
            .iter()
            .map(|p| ProblemRow {
                uri: p.type_uri().to_owned(),
                status: p.status(),
                title: p.title(),
            })
            .collect(),
    };
    let name = match format {
        DocFormat::Markdown => "docs.md",
        DocFormat::Html => "docs.html",
    };
    let env = environment();
    let template = env.get_template(name).map_err(template_error)?;
    template
        .render(Value::from(Serde(&page)))
        .map_err(template_error)
}

/// The page title of the docs of a document whose `info.title` is `title`:
/// `Orders: retrying safely`; without a title, `Retrying these operations safely`.
pub fn default_title(doc: Option<&crate::openapi::Document>) -> String {
    let title = doc
        .and_then(|d| d.root.get("info"))
        .and_then(|i| i.get("title"))
        .and_then(serde_json::Value::as_str)
        .map(str::trim)
        .filter(|t| !t.is_empty());
    match title {
        Some(t) => format!("{t}: retrying safely"),
        None => "Retrying these operations safely".to_owned(),
    }
}

fn template_error(e: minijinja::Error) -> crate::Error {
    crate::Error::new(format!("rendering the docs failed (a bug in idem): {e:#}"))
}
