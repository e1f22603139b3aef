//! The names of a [`RedisStore`](super::RedisStore)'s values, on one server and on a
//! cluster (the layout of the store's module docs).
//!
//! On a cluster, every name one script touches must hash to one slot. A record's hash and
//! its outbox carry the hash tag `{<bucket>}`: the bucket (0 to [`BUCKETS`] − 1) is drawn
//! from the record's own identity (operation, client, key), so records spread over every
//! master — not by prefix (all on one master) nor by client (a large tenant on one). A
//! client's budget names carry a tag of their own, drawn from the client. On one server
//! the names have no tag, as they always had.

use std::borrow::Cow;
use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::store::RecordKey;

/// How many hash tags a cluster's records are spread over, each with its own outbox:
/// enough to reach every master of a large cluster (16,384 slots; a tag is one slot).
pub(super) const BUCKETS: u16 = 1024;

/// Where a store's names live.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    prefix: String,
    cluster: bool,
    /// The prefix as it starts every name, escaped once ([`Layout::new`]).
    head: String,
}

impl Layout {
    /// The layout of `prefix`, on a cluster or one server. The prefix is escaped here,
    /// once, not for every name: `%` and `:` (and, on a cluster, `{` and `}`, which
    /// would start a hash tag).
    pub(super) fn new(prefix: String, cluster: bool) -> Layout {
        let mut head = segment(&prefix).into_owned();
        if cluster && head.contains(['{', '}']) {
            head = head.replace('{', "%7B").replace('}', "%7D");
        }
        Layout {
            prefix,
            cluster,
            head,
        }
    }

    /// The store's prefix, as given.
    pub(super) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the names carry hash tags (a cluster).
    pub(super) fn cluster(&self) -> bool {
        self.cluster
    }

    /// The escaped prefix that starts every name.
    fn head(&self) -> &str {
        &self.head
    }

    /// The name of the hash that holds `key`'s record:
    /// `<prefix>:<operation>:<client length>:<client>:<key>` on one server,
    /// `<prefix>:{<bucket>}:<operation>:…` on a cluster.
    pub(super) fn record(&self, key: &RecordKey) -> String {
        let operation = segment(&key.operation);
        let mut name = String::with_capacity(
            self.head.len() + operation.len() + key.client.len() + key.key.len() + 16,
        );
        name.push_str(&self.head);
        name.push(':');
        // Writing to a `String` cannot fail.
        if self.cluster {
            let _ = write!(name, "{{{}}}:", bucket(key));
        }
        name.push_str(&operation);
        let _ = write!(name, ":{}:", key.client.len());
        name.push_str(&key.client);
        name.push(':');
        name.push_str(&key.key);
        name
    }

    /// The names of `client`'s budget accounting (the store's scripts, `BUDGET`): its
    /// expiry buckets by their end, and their counts.
    /// `<prefix>/budget-ends/<client length>:<client>` and `<prefix>/budget-counts/…`,
    /// outside the prefix's records (`<prefix>:…`), so that listing and purging never
    /// meet them; on a cluster both carry the client's tag. (`budget/` and
    /// `budget-bytes/` were an earlier accounting's, by record; left to expire.)
    pub(super) fn budget(&self, client: &str) -> (String, String) {
        let head = self.head();
        let tag = if self.cluster {
            let digest = Sha256::digest(client.as_bytes());
            format!("{{c{}}}", hex::encode(&digest[..8]))
        } else {
            String::new()
        };
        (
            format!("{head}/budget-ends/{tag}{}:{client}", client.len()),
            format!("{head}/budget-counts/{tag}{}:{client}", client.len()),
        )
    }

    /// The sorted set of staged deliveries of `key`'s record: `<prefix>/outbox` on one
    /// server, `<prefix>/outbox/{<bucket>}` (the record's tag) on a cluster.
    pub(super) fn outbox(&self, key: &RecordKey) -> String {
        self.outbox_of(self.cluster.then(|| bucket(key)))
    }

    /// Every outbox: one on one server, one per bucket on a cluster.
    pub(super) fn outboxes(&self) -> Vec<String> {
        if self.cluster {
            (0..BUCKETS).map(|b| self.outbox_of(Some(b))).collect()
        } else {
            vec![self.outbox_of(None)]
        }
    }

    fn outbox_of(&self, bucket: Option<u16>) -> String {
        match bucket {
            Some(b) => format!("{}/outbox/{{{b}}}", self.head()),
            None => format!("{}/outbox", self.head()),
        }
    }

    /// The `SCAN` pattern of the prefix's records, or of one operation's.
    pub(super) fn pattern(&self, operation: Option<&str>) -> String {
        let head = escape_pattern(self.head());
        let tag = if self.cluster { "{*}:" } else { "" };
        match operation {
            Some(op) => format!("{head}:{tag}{}:*", escape_pattern(&segment(op))),
            None => format!("{head}:*"),
        }
    }

    /// The [`RecordKey`] a record's name of this layout holds, or `None` for a name of
    /// another layout or prefix.
    pub(super) fn key_of(&self, name: &[u8]) -> Option<RecordKey> {
        let name = std::str::from_utf8(name).ok()?;
        let mut rest = name.strip_prefix(self.head())?.strip_prefix(':')?;
        if self.cluster {
            let (tag, after) = rest.strip_prefix('{')?.split_once("}:")?;
            tag.parse::<u16>().ok().filter(|b| *b < BUCKETS)?;
            rest = after;
        }
        let (operation, rest) = rest.split_once(':')?;
        let (len, rest) = rest.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let client = rest.get(..len)?;
        let key = rest.get(len..)?.strip_prefix(':')?;
        let operation = operation.replace("%3A", ":").replace("%25", "%");
        let key = RecordKey::new(operation, client, key);
        // A name whose tag is not its key's was not written by this layout.
        (self.record(&key) == name).then_some(key)
    }

    /// The hash tag of a record's name on a cluster (`{<bucket>}`), by which a batch of
    /// names is split into one script call per slot; `None` on one server, or for a
    /// name without one.
    pub(super) fn tag_of<'a>(&self, name: &'a [u8]) -> Option<&'a [u8]> {
        if !self.cluster {
            return None;
        }
        let open = name.iter().position(|b| *b == b'{')?;
        let close = name[open..].iter().position(|b| *b == b'}')?;
        Some(&name[open..=open + close])
    }
}

/// The bucket of `key`'s record on a cluster: the first two bytes of the SHA-256 of its
/// parts, each preceded by its length, modulo [`BUCKETS`]. The same on every instance
/// and every version (it places records; changing it would lose them).
pub(super) fn bucket(key: &RecordKey) -> u16 {
    let mut hasher = Sha256::new();
    for part in [&key.operation, &key.client, &key.key] {
        hasher.update(part.len().to_string().as_bytes());
        hasher.update(b":");
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    u16::from_be_bytes([digest[0], digest[1]]) % BUCKETS
}

/// A name's part with `%` and `:` escaped, so that the first `:` after it ends it.
pub(super) fn segment(text: &str) -> Cow<'_, str> {
    if text.contains([':', '%']) {
        Cow::Owned(text.replace('%', "%25").replace(':', "%3A"))
    } else {
        Cow::Borrowed(text)
    }
}

/// `SCAN` patterns treat `*`, `?`, `[`, `]` and `\` specially.
pub(super) fn escape_pattern(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(prefix: &str, cluster: bool) -> Layout {
        Layout::new(prefix.to_owned(), cluster)
    }

    #[test]
    fn one_server_keeps_the_names_it_always_had() {
        let one = layout("idem", false);
        let key = RecordKey::new("op", "a:1", "k");
        assert_eq!(one.record(&key), "idem:op:3:a:1:k");
        assert_eq!(one.outbox(&key), "idem/outbox");
        assert_eq!(one.budget("c").0, "idem/budget-ends/1:c");
        assert_eq!(one.key_of(one.record(&key).as_bytes()), Some(key));
        assert_eq!(one.tag_of(b"idem:{1}:x"), None);
    }

    /// On a cluster a record's name, its outbox and nothing else carry its tag; a
    /// prefix with braces cannot start a tag of its own; names round-trip; hostile
    /// clients and keys (braces, colons) keep their own records.
    #[test]
    fn cluster_names_carry_the_records_tag() {
        let c = layout("svc{x}", true);
        let key = RecordKey::new("op:1", "{tenant}", "k}{");
        let name = c.record(&key);
        let b = bucket(&key);
        assert_eq!(
            name,
            format!("svc%7Bx%7D:{{{b}}}:op%3A1:8:{{tenant}}:k}}{{")
        );
        assert_eq!(
            c.tag_of(name.as_bytes()),
            Some(format!("{{{b}}}").as_bytes())
        );
        assert!(c.outbox(&key).ends_with(&format!("/outbox/{{{b}}}")));
        assert_eq!(c.key_of(name.as_bytes()), Some(key.clone()));
        assert_eq!(c.outboxes().len(), usize::from(BUCKETS));
        let (names, sizes) = c.budget("{tenant}");
        assert_eq!(c.tag_of(names.as_bytes()), c.tag_of(sizes.as_bytes()));
        // Another layout's names, and a tag that is not the key's, are not records.
        assert_eq!(layout("svc{x}", false).key_of(name.as_bytes()), None);
        let forged = name.replacen(
            &format!("{{{b}}}"),
            &format!("{{{}}}", (b + 1) % BUCKETS),
            1,
        );
        assert_eq!(c.key_of(forged.as_bytes()), None);
        assert!(
            c.pattern(Some("op:1"))
                .starts_with("svc%7Bx%7D:{*}:op%3A1:")
        );
    }

    /// Records spread over the buckets: 100,000 keys of one client and one operation
    /// give every bucket between half and twice its share.
    #[test]
    fn one_clients_records_spread_over_every_bucket() {
        let mut counts = vec![0u32; usize::from(BUCKETS)];
        for i in 0..100_000 {
            counts[usize::from(bucket(&RecordKey::new("op", "tenant", format!("k{i}"))))] += 1;
        }
        let share = 100_000 / u32::from(BUCKETS);
        assert!(
            counts.iter().all(|n| *n >= share / 2 && *n <= 2 * share),
            "{counts:?}"
        );
    }
}
