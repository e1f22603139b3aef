//! Text with inline code and links, rendered by the templates: Markdown through the
//! [`markdown`] filter, HTML through a template macro under minijinja's auto-escaping.

use serde::{Deserialize, Serialize};

/// A run of text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Span {
    /// Plain words, written by idem (never user input with markup in it).
    Text(String),
    /// Code: a header name, a field, a status line.
    Code(String),
    /// An `http:` or `https:` URL.
    Link(String),
}

/// A sentence or paragraph made of [`Span`]s.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Rich(pub Vec<Span>);

impl Rich {
    /// Text written by idem, where `` `x` `` marks code.
    pub fn new(text: &str) -> Rich {
        Rich::default().text(text)
    }

    /// Appends idem's text, where `` `x` `` marks code.
    pub fn text(mut self, text: &str) -> Rich {
        for (i, part) in text.split('`').enumerate() {
            if part.is_empty() {
                continue;
            }
            self.0.push(if i % 2 == 1 {
                Span::Code(part.to_owned())
            } else {
                Span::Text(part.to_owned())
            });
        }
        self
    }

    /// Appends a value as code, whatever characters it holds.
    pub fn code(mut self, value: impl Into<String>) -> Rich {
        self.0.push(Span::Code(value.into()));
        self
    }

    /// Appends a URL: a link when it is `http:` or `https:`, else code (a `javascript:`
    /// URL never becomes a link).
    pub fn url(mut self, url: &str) -> Rich {
        let lower = url.to_ascii_lowercase();
        if (lower.starts_with("https://") || lower.starts_with("http://"))
            && !url.contains(|c: char| c.is_whitespace() || c == '<' || c == '>')
        {
            self.0.push(Span::Link(url.to_owned()));
        } else {
            self.0.push(Span::Code(url.to_owned()));
        }
        self
    }

    /// Appends another rich text.
    pub fn then(mut self, other: Rich) -> Rich {
        self.0.extend(other.0);
        self
    }
}

/// A Markdown code span that holds `value` whatever it contains (CommonMark §6.1): a
/// fence longer than any run of backticks inside, padded when the value starts or ends
/// with a backtick.
pub fn code_span(value: &str) -> String {
    let longest = longest_run(value, '`');
    let fence = "`".repeat(longest + 1);
    let pad = if value.starts_with('`') || value.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{value}{pad}{fence}")
}

/// A fence for a fenced code block holding `value` (at least three backticks).
pub fn block_fence(value: &str) -> String {
    "`".repeat((longest_run(value, '`') + 1).max(3))
}

fn longest_run(value: &str, c: char) -> usize {
    let mut longest = 0;
    let mut run = 0;
    for ch in value.chars() {
        if ch == c {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    longest
}

/// Text that idem did not write (a spec's title, an operation's summary, a route) as
/// literal Markdown inline text, escaped as the HTML page escapes it: the characters
/// Markdown reads as inline syntax or raw HTML (`\`, `` ` ``, `*`, `_`, `[`, `]`, `<`, `>`,
/// `&`, `|`, `~`) are backslash-escaped (CommonMark §2.4: any ASCII punctuation may be),
/// a leading block marker (`#`, `-`, `+`, `=`, `>`, or a number followed by `.` or `)`)
/// too, and line breaks become spaces, so the value stays one line of text where it is
/// put: `<script>` shows as text, and `# x` stays a summary rather than a heading.
pub fn literal(text: &str) -> String {
    let text = text.replace(['\n', '\r'], " ");
    let mut out = String::with_capacity(text.len() + 8);
    let trimmed = text.trim_start();
    let digits = trimmed.len()
        - trimmed
            .trim_start_matches(|c: char| c.is_ascii_digit())
            .len();
    for (i, c) in trimmed.char_indices() {
        let block_marker = (i == 0 && matches!(c, '#' | '-' | '+' | '=' | '>'))
            || (i == digits && digits > 0 && matches!(c, '.' | ')'));
        if block_marker
            || matches!(
                c,
                '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '&' | '|' | '~'
            )
        {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Renders rich text (as the templates see it) as Markdown. In a table cell, `|` is
/// escaped and line breaks become spaces.
pub fn markdown(spans: &[Span], cell: bool) -> String {
    let mut out = String::new();
    for span in spans {
        match span {
            Span::Text(t) => out.push_str(t),
            Span::Code(c) => out.push_str(&code_span(c)),
            Span::Link(url) => {
                out.push('<');
                out.push_str(url);
                out.push('>');
            }
        }
    }
    if cell {
        out = out.replace('|', "\\|").replace(['\n', '\r'], " ");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_spans_hold_backticks() {
        assert_eq!(code_span("a"), "`a`");
        assert_eq!(code_span("a`b"), "``a`b``");
        assert_eq!(code_span("`x"), "`` `x ``");
        assert_eq!(block_fence("```"), "````");
    }

    #[test]
    fn only_web_urls_become_links() {
        let r = Rich::default()
            .url("https://runbooks.example.com/a")
            .url("javascript:alert(1)");
        assert_eq!(
            r.0,
            [
                Span::Link("https://runbooks.example.com/a".into()),
                Span::Code("javascript:alert(1)".into())
            ]
        );
    }

    #[test]
    fn text_marks_code_with_backticks() {
        assert_eq!(
            Rich::new("wait for `Retry-After`, then retry").0,
            [
                Span::Text("wait for ".into()),
                Span::Code("Retry-After".into()),
                Span::Text(", then retry".into())
            ]
        );
        assert_eq!(markdown(&Rich::new("a | `b|c`").0, true), "a \\| `b\\|c`");
    }

    #[test]
    fn text_from_a_spec_is_literal() {
        assert_eq!(
            literal("<script>alert(1)</script>"),
            "\\<script\\>alert(1)\\</script\\>"
        );
        assert_eq!(
            literal("Orders *v2* & [more](x)"),
            "Orders \\*v2\\* \\& \\[more\\](x)"
        );
        assert_eq!(literal("# heading\nsecond line"), "\\# heading second line");
        assert_eq!(literal("- item"), "\\- item");
        assert_eq!(literal("12. twelve"), "12\\. twelve");
        assert_eq!(literal("a|b`c\\d"), "a\\|b\\`c\\\\d");
        assert_eq!(literal("POST /orders/{id}"), "POST /orders/{id}");
        assert_eq!(literal(""), "");
    }
}
