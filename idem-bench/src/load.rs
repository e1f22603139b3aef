//! The request streams: one `wrk` Lua script per path, the same bytes for every variant.
//!
//! Every request carries both identities, `X-Client-Id: client-<i>` (idem's) and
//! `Cookie: sid=<session i>` (`axum-idempotent`'s); each variant reads the one it knows and
//! the bare handler neither.

use crate::wrk::THREAD_IDS;

/// The request body of every request.
pub const BODY: &str = crate::wrk::ORDER;

/// One measured path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Every request a new `Idempotency-Key`, the clients in turn.
    NewKey,
    /// Every request repeats one of the keys the warm-up completed (`r-<i>` of client
    /// `i`), the clients in turn.
    Replay,
    /// Every request a new key, all from client 0 (one key scope, one session).
    OneScope,
}

impl Path {
    /// Every path, in the order of the table.
    pub const ALL: [Path; 3] = [Path::NewKey, Path::Replay, Path::OneScope];

    /// The path's name in the table.
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self {
            Path::NewKey => "new key",
            Path::Replay => "replay of a completed key",
            Path::OneScope => "all keys of one client (1 scope)",
        }
    }

    /// A short name, for the progress lines and the script's file name.
    #[must_use]
    pub const fn short(self) -> &'static str {
        match self {
            Path::NewKey => "new",
            Path::Replay => "replay",
            Path::OneScope => "scope",
        }
    }

    /// The Lua script of this path for as many clients as `cookies` has (entry `i` is
    /// client `i`'s `Cookie` header value). The script expects the global `run` that
    /// `wrk.rs` prepends, so that new keys are new in every run.
    #[must_use]
    pub fn script(self, cookies: &[String]) -> String {
        let clients = cookies.len().max(1);
        // The two wrk threads start half-way apart in the list of clients.
        let client = match self {
            Path::NewKey | Path::Replay => format!("(counter + tid * {}) % clients", clients / 2),
            Path::OneScope => "0".to_owned(),
        };
        let key = match self {
            Path::NewKey => r#""n-" .. run .. "-" .. tid .. "-" .. counter"#,
            Path::Replay => r#""r-" .. c"#,
            Path::OneScope => r#""s-" .. run .. "-" .. tid .. "-" .. counter"#,
        };
        let mut table = String::with_capacity(cookies.len() * 32);
        for cookie in cookies {
            table.push_str(&format!("  \"{cookie}\",\n"));
        }
        format!(
            r#"clients = {clients}
cookies = {{
{table}}}
body = '{BODY}'
{THREAD_IDS}
function request()
  counter = counter + 1
  local c = {client}
  return wrk.format("POST", "/orders", {{
    ["Content-Type"] = "application/json",
    ["X-Client-Id"] = "client-" .. c,
    ["Cookie"] = cookies[c + 1],
    ["Idempotency-Key"] = {key},
  }}, body)
end
"#
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_name_every_cookie_and_their_own_keys() {
        let cookies = vec!["sid=a".to_owned(), "sid=b".to_owned()];
        let new = Path::NewKey.script(&cookies);
        assert!(new.contains("clients = 2\n"));
        assert!(new.contains("  \"sid=a\",\n  \"sid=b\",\n"));
        assert!(new.contains(r#"local c = (counter + tid * 1) % clients"#));
        assert!(new.contains(r#""n-" .. run"#));
        assert!(Path::Replay.script(&cookies).contains(r#"= "r-" .. c,"#));
        assert!(Path::OneScope.script(&cookies).contains("local c = 0\n"));
    }
}
