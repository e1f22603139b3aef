//! The lost answer as a sequence diagram: the client, the server and the idempotency
//! store; the first attempt, whose answer is lost on the way back; the retry with the same
//! key; the replay of the stored answer.
//!
//! This module lays the diagram out (every coordinate, every label); the HTML template
//! draws it as inline SVG, so minijinja escapes every label, and the page needs no
//! script, font or image from anywhere. Text cannot be measured without a browser, so
//! a label that may be too wide for its gap is given a `textLength` that squeezes it in.

use serde::Serialize;

use idem_contract::Contract;

use super::content::{OperationInfo, header_or_field, lookup_path};
use crate::extension::EXAMPLE_KEY;

/// The diagram's width, in SVG units (CSS pixels at full size).
pub const WIDTH: u32 = 860;

/// The lanes' centres: the client, the server, the store.
const LANES: [u32; 3] = [120, 440, 740];
/// Where the lanes' boxes end and the first row starts.
const TOP: u32 = 48;
/// The average advance of a 13 px label's character, a little generous.
const CHAR_WIDTH: f32 = 7.4;

/// A sequence diagram, laid out.
#[derive(Clone, Debug, Serialize)]
pub struct Diagram {
    /// The width, in SVG units.
    pub width: u32,
    /// The height, in SVG units.
    pub height: u32,
    /// The accessible name.
    pub title: String,
    /// The accessible description: the sequence in one sentence.
    pub description: String,
    /// The participants.
    pub lanes: Vec<Lane>,
    /// The messages, in order.
    pub arrows: Vec<Arrow>,
    /// What happens on a lane, or across them.
    pub notes: Vec<Note>,
}

/// A participant: its box at the top and its lifeline.
#[derive(Clone, Debug, Serialize)]
pub struct Lane {
    /// The lane's centre.
    pub x: u32,
    /// Its name, such as `Client`.
    pub label: &'static str,
    /// Where its lifeline ends.
    pub bottom: u32,
}

/// A message from one lane to another.
#[derive(Clone, Debug, Serialize)]
pub struct Arrow {
    /// `call` (a request), `reply` (an answer inside the server), `lost` (an answer
    /// that never arrives) or `replay` (the stored answer, sent again).
    pub kind: &'static str,
    /// Where the line starts.
    pub x1: u32,
    /// Where the line ends: at the arrowhead's base, or at the cross of a lost answer.
    pub x2: u32,
    /// The line's height.
    pub y: u32,
    /// The arrowhead, as the `points` of a polygon; empty for a lost answer.
    pub head: String,
    /// The cross where a lost answer ends, as the `d` of a path.
    pub cross: Option<String>,
    /// The label above the line.
    pub label: Text,
    /// A second, smaller label below the line.
    pub sub: Option<Text>,
}

/// A label and where it goes (centred on `x`).
#[derive(Clone, Debug, Serialize)]
pub struct Text {
    /// The words.
    pub text: String,
    /// The centre.
    pub x: u32,
    /// The baseline.
    pub y: u32,
    /// The width to squeeze the text into when it may not fit its gap.
    pub fit: Option<u32>,
}

/// A box with one line of text.
#[derive(Clone, Debug, Serialize)]
pub struct Note {
    /// The left edge.
    pub x: u32,
    /// The top edge.
    pub y: u32,
    /// The width.
    pub width: u32,
    /// The text, centred.
    pub text: Text,
}

/// The rows, top to bottom, as a builder keeps them.
struct Layout {
    y: u32,
    arrows: Vec<Arrow>,
    notes: Vec<Note>,
}

impl Layout {
    fn text(text: String, x: u32, y: u32, room: u32) -> Text {
        let estimate = (text.chars().count() as f32 * CHAR_WIDTH).ceil() as u32;
        Text {
            fit: (estimate > room).then_some(room),
            text,
            x,
            y,
        }
    }

    /// A message from lane `from` to lane `to`.
    fn arrow(
        &mut self,
        kind: &'static str,
        from: usize,
        to: usize,
        label: &str,
        sub: Option<&str>,
    ) {
        let (x1, x2) = (LANES[from], LANES[to]);
        self.y += if sub.is_some() { 34 } else { 30 };
        let y = self.y;
        let centre = x1.midpoint(x2);
        let room = x1.abs_diff(x2) - 24;
        let right = x2 > x1;
        let (end, head, cross) = if kind == "lost" {
            // The answer gets a little over halfway back, then is lost.
            let at = if right { centre + 30 } else { centre - 30 };
            let d = format!(
                "M{} {} L{} {} M{} {} L{} {}",
                at - 7,
                y - 7,
                at + 7,
                y + 7,
                at + 7,
                y - 7,
                at - 7,
                y + 7
            );
            (at, String::new(), Some(d))
        } else {
            let base = if right { x2 - 10 } else { x2 + 10 };
            let head = format!("{x2},{y} {base},{} {base},{}", y - 5, y + 5);
            (base, head, None)
        };
        // A lost answer's labels sit over the part of the way it made.
        let (centre, room) = if cross.is_some() {
            (x1.midpoint(end), x1.abs_diff(end) + 40)
        } else {
            (centre, room)
        };
        self.arrows.push(Arrow {
            kind,
            x1,
            x2: end,
            y,
            head,
            cross,
            label: Layout::text(label.to_owned(), centre, y - 8, room),
            sub: sub.map(|s| Layout::text(s.to_owned(), centre, y + 17, room)),
        });
        self.y += if sub.is_some() { 14 } else { 4 };
    }

    /// A note across lanes `from` to `to` (the same lane for a note on one lane).
    fn note(&mut self, from: usize, to: usize, text: &str) {
        self.y += 16;
        let (left, right) = (LANES[from] - 108, LANES[to] + 108);
        let width = right - left;
        self.notes.push(Note {
            x: left,
            y: self.y,
            width,
            text: Layout::text(text.to_owned(), left + width / 2, self.y + 18, width - 16),
        });
        self.y += 26;
    }
}

/// The lost answer of `contract`'s operation (named `name`, with the route `info` gives)
/// as a sequence diagram: attempt 1 runs and its answer is lost; attempt 2, with the same
/// key, gets the stored answer replayed. With one attempt allowed, the status lookup
/// tells the outcome instead.
pub fn lost_answer(contract: &Contract, info: &OperationInfo, name: &str) -> Diagram {
    const CLIENT: usize = 0;
    const SERVER: usize = 1;
    const STORE: usize = 2;
    let route = match (&info.method, &info.path) {
        (Some(m), Some(p)) => format!("{m} {p}"),
        _ => name.to_owned(),
    };
    let short_key = format!("{}…", &EXAMPLE_KEY[..8]);
    let (in_header, key) = header_or_field(contract);
    let key_line = if in_header {
        format!("{key}: {short_key}")
    } else {
        format!("\"{key}\": \"{short_key}\" in the body")
    };
    let success = info.success.as_deref().unwrap_or("201 Created");
    let mut l = Layout {
        y: TOP,
        arrows: Vec::new(),
        notes: Vec::new(),
    };
    l.arrow(
        "call",
        CLIENT,
        SERVER,
        &format!("attempt 1: {route}"),
        Some(&key_line),
    );
    l.arrow("call", SERVER, STORE, "claim the key: processing", None);
    l.arrow("reply", STORE, SERVER, "a new key: this attempt runs", None);
    l.note(SERVER, SERVER, "the operation runs, once");
    l.arrow("call", SERVER, STORE, "store the answer: completed", None);
    l.arrow(
        "lost",
        SERVER,
        CLIENT,
        success,
        Some("lost on the way back"),
    );
    let retries = contract.max_attempts >= 2;
    let lookup = lookup_path(contract).map_or_else(
        || "GET <the status lookup>".to_owned(),
        |p| format!("GET {}", p.replace("{key}", &short_key)),
    );
    if retries {
        l.note(CLIENT, CLIENT, "no answer: retry, the same key");
        l.arrow(
            "call",
            CLIENT,
            SERVER,
            &format!("attempt 2: {route}"),
            Some(&format!("{key_line} (the same)")),
        );
    } else {
        l.note(CLIENT, CLIENT, "no answer: ask the status lookup");
        l.arrow("call", CLIENT, SERVER, &lookup, Some("the same key"));
    }
    l.arrow("call", SERVER, STORE, "look up the key", None);
    l.arrow(
        "reply",
        STORE,
        SERVER,
        "completed, with the stored answer",
        None,
    );
    if retries {
        l.arrow(
            "replay",
            SERVER,
            CLIENT,
            &format!("{success}, replayed"),
            Some("Idempotent-Replayed: true"),
        );
        l.note(
            CLIENT,
            STORE,
            "one operation: both attempts carry the same Operation-Id",
        );
    } else {
        l.arrow(
            "replay",
            SERVER,
            CLIENT,
            "200 OK, state: completed",
            Some(&format!("response: {success}, as stored")),
        );
        l.note(CLIENT, STORE, "one operation: the lookup tells its outcome");
    }
    let height = l.y + 22;
    let description = if retries {
        format!(
            "The client sends {route} with a new idempotency key. The server claims the key in the idempotency store, runs the operation once and stores its answer, {success}, which is lost on the way back. The client retries the same request with the same key; the server finds the stored answer and replays it with Idempotent-Replayed: true."
        )
    } else {
        format!(
            "The client sends {route} with a new idempotency key. The server claims the key in the idempotency store, runs the operation once and stores its answer, {success}, which is lost on the way back. The client asks the status lookup with the same key, which answers with the operation's state, completed, and the stored answer."
        )
    };
    Diagram {
        width: WIDTH,
        height,
        title: format!("A lost answer on {route}, and the retry"),
        description,
        lanes: ["Client", "Server", "Idempotency store"]
            .into_iter()
            .zip(LANES)
            .map(|(label, x)| Lane {
                x,
                label,
                bottom: height - 10,
            })
            .collect(),
        arrows: l.arrows,
        notes: l.notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_labels_are_squeezed_into_their_gap() {
        let short = Layout::text("claim the key".into(), 0, 0, 276);
        assert_eq!(short.fit, None);
        let long = Layout::text("x".repeat(80), 0, 0, 276);
        assert_eq!(long.fit, Some(276));
    }
}
