//! A linear pre-check of YAML text against flow collections (`[`, `{`) nested deeper
//! than [`MAX_FLOW_DEPTH`].
//!
//! The YAML scanner (libyaml's design, in yaml_serde) does work proportional to the
//! number of open flow collections for every token, so 100,000 nested `[` on one line
//! keep it busy for minutes before the deserializer's own recursion limit (128) refuses
//! them. This scan follows YAML's rules for where a flow collection or a quoted scalar
//! can start (at the start of a node, never inside a plain or block scalar), so brackets
//! in descriptions do not count.

use crate::error::Position;

/// The deepest flow nesting let through to the parser: far more than the 128 levels the
/// deserializer accepts, so no readable document is refused here.
pub const MAX_FLOW_DEPTH: usize = 1000;

/// Where flow collections first nest deeper than [`MAX_FLOW_DEPTH`], if they do.
pub(crate) fn too_deep(text: &str) -> Option<Position> {
    let bytes = text.as_bytes();
    let mut depth = 0usize;
    let mut line = 1usize;
    let mut i = 0usize;
    // The indentation of the line that opened a block scalar: its content is every
    // following line that is blank or indented more.
    let mut block_scalar: Option<usize> = None;
    while i < bytes.len() {
        // Start of a line.
        let line_start = i;
        let indent = bytes[i..].iter().take_while(|&&b| b == b' ').count();
        let line_end = bytes[i..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |p| i + p);
        let blank = bytes[i + indent..line_end]
            .iter()
            .all(|b| b.is_ascii_whitespace());
        if let Some(bi) = block_scalar {
            if blank || indent > bi {
                i = line_end + 1;
                line += 1;
                continue;
            }
            block_scalar = None;
        }
        let mut node_start = true;
        let mut prev_space = true;
        i += indent;
        while i < line_end {
            let b = bytes[i];
            let next = bytes.get(i + 1).copied().unwrap_or(b'\n');
            let next_space = matches!(next, b' ' | b'\t' | b'\n' | b'\r');
            match b {
                b' ' | b'\t' | b'\r' => {
                    prev_space = true;
                    i += 1;
                    continue;
                }
                b'#' if prev_space => break,
                b'\'' | b'"' if node_start => {
                    // A quoted scalar, possibly over several lines.
                    i += 1;
                    while i < bytes.len() {
                        match bytes[i] {
                            b'\n' => line += 1,
                            b'\\' if b == b'"' => i += 1,
                            q if q == b && b == b'\'' && bytes.get(i + 1) == Some(&b'\'') => i += 1,
                            q if q == b => break,
                            _ => {}
                        }
                        i += 1;
                    }
                    node_start = false;
                }
                b'[' | b'{' if depth > 0 || node_start => {
                    depth += 1;
                    if depth > MAX_FLOW_DEPTH {
                        let column = text[line_start..i].chars().count() + 1;
                        return Some(Position { line, column });
                    }
                    node_start = true;
                }
                b']' | b'}' if depth > 0 => {
                    depth -= 1;
                    node_start = false;
                }
                b',' if depth > 0 => node_start = true,
                b':' if next_space || depth > 0 => node_start = true,
                b'-' | b'?' if node_start && next_space => {}
                b'|' | b'>' if node_start && depth == 0 => {
                    block_scalar = Some(indent);
                    break;
                }
                b'&' | b'!' | b'*' if node_start => {
                    // An anchor, tag or alias: the node (if any) follows it.
                    while i + 1 < line_end
                        && !matches!(bytes[i + 1], b' ' | b'\t' | b',' | b']' | b'}')
                    {
                        i += 1;
                    }
                }
                _ => node_start = false,
            }
            prev_space = false;
            i += 1;
        }
        // Past the end of the line (or the quoted scalar that ended on a later one).
        i = bytes[i.min(bytes.len())..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |p| i + p + 1);
        line += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_flow_collections_only() {
        let deep = format!("openapi: 3.0.3\nx: {}\n", "[".repeat(MAX_FLOW_DEPTH + 1));
        assert_eq!(
            too_deep(&deep),
            Some(Position {
                line: 2,
                column: 4 + MAX_FLOW_DEPTH
            })
        );
        let json = format!("{{\"a\": {}", "{\"b\": ".repeat(MAX_FLOW_DEPTH));
        assert!(too_deep(&json).is_some());
        let prose = format!(
            "a: see [this {}\nb: |\n  {}\nc: 'quoted {}'\nd: \"{}\" # {}\n",
            "[".repeat(2000),
            "[".repeat(2000),
            "[".repeat(2000),
            "{".repeat(2000),
            "[".repeat(2000)
        );
        assert_eq!(too_deep(&prose), None);
        assert_eq!(too_deep("a: [1, [2, {b: [3]}]]\n- [x]\n"), None);
    }
}
