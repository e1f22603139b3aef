//! Reading contracts from Rust source: every `#[idem::contract(..)]` (or `#[contract(..)]`)
//! attribute on an item, read by the same parser the macro uses
//! ([`idem_contract::parse::parse`]), so the command reports the same errors at the same
//! places as the compiler.
//!
//! Files are parsed with syn in a thread with a large stack, after two cheap guards
//! against input crafted to exhaust the parser's recursion: delimiters nested deeper than
//! [`MAX_NESTING`] and runs of more than [`MAX_PUNCT_RUN`] operator characters are
//! refused (no real program comes near either).

use std::path::{Path, PathBuf};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::spanned::Spanned;
use syn::visit::Visit;

use idem_contract::Contract;

use crate::error::{Error, Position};

/// The deepest nesting of `()`, `[]` and `{}` read.
pub const MAX_NESTING: usize = 256;
/// The longest run of consecutive operator characters read (`- - - - x`).
pub const MAX_PUNCT_RUN: usize = 256;
/// The largest source file read: 8 MiB.
pub const MAX_SOURCE_BYTES: usize = 8 * 1024 * 1024;

/// A contract found in a source file.
#[derive(Clone, Debug)]
pub struct Found {
    /// The contract, checked: the parser found no error.
    pub contract: Contract,
    /// The file.
    pub file: PathBuf,
    /// Where its attribute starts.
    pub position: Position,
}

/// What a scan found: every valid contract and every error, in file order.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    /// The valid contracts.
    pub contracts: Vec<Found>,
    /// Every error: files that cannot be read or parsed, and every contract error.
    pub errors: Vec<Error>,
    /// How many `.rs` files were read.
    pub files: usize,
}

/// Scans `paths`: files, and folders searched recursively for `.rs` files (hidden
/// folders and folders named `target` are skipped; symbolic links to folders are not
/// followed). Files are read in sorted order, so output is stable.
pub fn scan(paths: &[PathBuf]) -> Scan {
    let paths = paths.to_vec();
    // syn parses recursively; a large stack keeps deep but legal code from overflowing.
    let worker = std::thread::Builder::new()
        .name("idem-scan".into())
        .stack_size(256 * 1024 * 1024)
        .spawn(move || {
            let mut scan = Scan::default();
            for path in &paths {
                walk(path, true, &mut scan);
            }
            scan
        });
    match worker.map(|h| h.join()) {
        Ok(Ok(scan)) => scan,
        _ => Scan {
            errors: vec![Error::new("the source scan failed unexpectedly")],
            ..Scan::default()
        },
    }
}

fn walk(path: &Path, explicit: bool, scan: &mut Scan) {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => {
            scan.errors
                .push(Error::in_file(path, format!("cannot read: {e}")));
            return;
        }
    };
    let is_dir = if meta.file_type().is_symlink() {
        // A link named on the command line is followed; links met while walking are
        // followed to files only (no cycles).
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() && !explicit => return,
            Ok(m) => m.is_dir(),
            Err(e) => {
                scan.errors
                    .push(Error::in_file(path, format!("cannot read: {e}")));
                return;
            }
        }
    } else {
        meta.is_dir()
    };
    if !is_dir {
        if explicit || path.extension().is_some_and(|e| e == "rs") {
            scan.files += 1;
            scan_file(path, scan);
        }
        return;
    }
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) => {
            scan.errors
                .push(Error::in_file(path, format!("cannot read the folder: {e}")));
            return;
        }
    };
    let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    children.sort();
    for child in children {
        let name = child
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with('.') || (name == "target" && child.is_dir()) {
            continue;
        }
        walk(&child, false, scan);
    }
}

fn scan_file(path: &Path, scan: &mut Scan) {
    let text = match crate::io::read_text(path) {
        Ok(text) => text,
        Err(e) => return scan.errors.push(e),
    };
    if text.len() > MAX_SOURCE_BYTES {
        return scan.errors.push(Error::in_file(
            path,
            format!(
                "the file is larger than {} MiB, the most idem reads as Rust source",
                MAX_SOURCE_BYTES / 1024 / 1024
            ),
        ));
    }
    let (found, errors) = scan_source(path, &text);
    scan.contracts.extend(found);
    scan.errors.extend(errors);
}

/// Scans the Rust source `text` of the file `path` (named in errors and results).
pub fn scan_source(path: &Path, text: &str) -> (Vec<Found>, Vec<Error>) {
    let result = scan_tokens(path, text);
    // Spans live in a per-thread table; every span was turned into a position above.
    proc_macro2::extra::invalidate_current_thread_spans();
    result
}

fn scan_tokens(path: &Path, text: &str) -> (Vec<Found>, Vec<Error>) {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // A shebang line is blanked rather than removed, so positions stay the file's own.
    let blanked;
    let text = if text.starts_with("#!") && !text.starts_with("#![") {
        let end = text.find('\n').unwrap_or(text.len());
        blanked = format!("{}{}", " ".repeat(end), &text[end..]);
        blanked.as_str()
    } else {
        text
    };
    let at = |span: Span, message: String| {
        let p = position(span);
        Error::at(path, p.line, p.column, message)
    };
    let tokens: TokenStream = match text.parse() {
        Ok(tokens) => tokens,
        Err(e) => {
            return (
                Vec::new(),
                vec![at(e.span(), format!("the file is not valid Rust: {e}"))],
            );
        }
    };
    if let Err((span, message)) = guard(&tokens) {
        return (Vec::new(), vec![at(span, message)]);
    }
    let file = match syn::parse2::<syn::File>(tokens) {
        Ok(file) => file,
        Err(e) => {
            return (
                Vec::new(),
                vec![at(e.span(), format!("the file is not valid Rust: {e}"))],
            );
        }
    };
    let mut collector = Collector {
        path,
        found: Vec::new(),
        errors: Vec::new(),
    };
    collector.visit_file(&file);
    (collector.found, collector.errors)
}

/// Line and column from 1, as rustc prints them.
fn position(span: Span) -> Position {
    let start = span.start();
    Position {
        line: start.line.max(1),
        column: start.column + 1,
    }
}

/// Refuses nesting and operator runs that could exhaust the parser's recursion.
fn guard(tokens: &TokenStream) -> Result<(), (Span, String)> {
    let mut stack = vec![tokens.clone().into_iter()];
    let mut run = 0usize;
    while let Some(iter) = stack.last_mut() {
        let Some(tree) = iter.next() else {
            stack.pop();
            continue;
        };
        match tree {
            TokenTree::Group(group) => {
                run = 0;
                if stack.len() >= MAX_NESTING {
                    return Err((
                        group.span(),
                        format!(
                            "brackets are nested deeper than {MAX_NESTING} levels; idem does not read this file"
                        ),
                    ));
                }
                stack.push(group.stream().into_iter());
            }
            TokenTree::Punct(p) => {
                run += 1;
                if run > MAX_PUNCT_RUN {
                    return Err((
                        p.span(),
                        format!(
                            "more than {MAX_PUNCT_RUN} operator characters in a row; idem does not read this file"
                        ),
                    ));
                }
            }
            _ => run = 0,
        }
    }
    Ok(())
}

struct Collector<'a> {
    path: &'a Path,
    found: Vec<Found>,
    errors: Vec<Error>,
}

/// Whether `attr` is `#[idem::contract ..]`, `#[::idem::contract ..]` or `#[contract ..]`.
fn is_contract(attr: &syn::Attribute) -> bool {
    let segments: Vec<String> = attr
        .path()
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    matches!(segments.as_slice(), [one] if one == "contract")
        || matches!(segments.as_slice(), [idem, c] if idem == "idem" && c == "contract")
}

impl Collector<'_> {
    fn attributes(&mut self, attrs: &[syn::Attribute], item: Option<&syn::Item>, what: &str) {
        for attr in attrs.iter().filter(|a| is_contract(a)) {
            let attr_pos = position(attr.span());
            let args = match &attr.meta {
                syn::Meta::Path(_) => TokenStream::new(),
                syn::Meta::List(list) => list.tokens.clone(),
                syn::Meta::NameValue(nv) => {
                    self.errors.push(Error::at(self.path, attr_pos.line, attr_pos.column, format!(
                        "write `#[idem::contract(..)]` with the properties in parentheses, not `= {}`",
                        quote_tokens(&nv.value)
                    )));
                    continue;
                }
            };
            let Some(item) = item else {
                self.errors.push(Error::at(
                    self.path,
                    attr_pos.line,
                    attr_pos.column,
                    format!(
                        "`#[idem::contract]` goes on an async axum handler function, not on {what}"
                    ),
                ));
                continue;
            };
            let parsed = idem_contract::parse::parse(args, attr.span(), Some(item));
            for error in &parsed.errors {
                for single in error.clone() {
                    let p = position(single.span());
                    let p = if single.span().start().line == 0 {
                        attr_pos
                    } else {
                        p
                    };
                    self.errors
                        .push(Error::at(self.path, p.line, p.column, single.to_string()));
                }
            }
            if let Some(contract) = parsed.contract {
                self.found.push(Found {
                    contract,
                    file: self.path.to_owned(),
                    position: attr_pos,
                });
            }
        }
    }
}

fn quote_tokens(expr: &syn::Expr) -> String {
    quote::ToTokens::to_token_stream(expr).to_string()
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::ForeignMod(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::TraitAlias(i) => &i.attrs,
            _ => &[],
        };
        self.attributes(attrs, Some(item), "this item");
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        // The macro sees a method as a function item, and the parser says what is wrong
        // with it (it takes `self`, or is not `async`).
        let item = syn::Item::Fn(syn::ItemFn {
            attrs: Vec::new(),
            vis: f.vis.clone(),
            modifiers: f.modifiers.clone(),
            sig: f.sig.clone(),
            block: Box::new(f.block.clone()),
        });
        self.attributes(&f.attrs, Some(&item), "a method");
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_impl_item_const(&mut self, i: &'ast syn::ImplItemConst) {
        self.attributes(&i.attrs, None, "a constant");
        syn::visit::visit_impl_item_const(self, i);
    }

    fn visit_impl_item_type(&mut self, i: &'ast syn::ImplItemType) {
        self.attributes(&i.attrs, None, "a type alias");
    }

    fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
        let (attrs, what) = match i {
            syn::TraitItem::Fn(f) => (&f.attrs[..], "a trait method"),
            syn::TraitItem::Const(c) => (&c.attrs[..], "a trait constant"),
            syn::TraitItem::Type(t) => (&t.attrs[..], "a trait's associated type"),
            _ => (&[][..], "a trait item"),
        };
        self.attributes(attrs, None, what);
        syn::visit::visit_trait_item(self, i);
    }

    fn visit_field(&mut self, f: &'ast syn::Field) {
        self.attributes(&f.attrs, None, "a field");
        syn::visit::visit_field(self, f);
    }

    fn visit_variant(&mut self, v: &'ast syn::Variant) {
        self.attributes(&v.attrs, None, "an enum variant");
        syn::visit::visit_variant(self, v);
    }
}
