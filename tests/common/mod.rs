//! What the integration tests share: a real server on 127.0.0.1 and the requests sent to
//! it, answers read whole, stores that fail on demand, and the contracted handlers and app
//! states that more than one test binary serves.
//!
//! Every test binary includes this module (`mod common;`) and uses only a part of it: the
//! rest is dead code in that binary, hence `allow(dead_code)` for the whole module.
#![allow(dead_code)]

/// An answer, read whole.
pub mod answer;
/// A count shared by the clones of an app state.
pub mod counter;
/// A store that fails any of its calls on demand, and counts them.
pub mod faults;
/// The contracted orders handlers that more than one binary serves.
pub mod orders;
/// A runtime of its own, for the tests that kill a process.
pub mod process;
/// HTTP/1.1 written byte for byte on a socket (the hostile tests).
pub mod raw;
/// A Redis server of the test's own, and an orders service on the Redis store.
#[cfg(feature = "redis")]
pub mod redis;
/// A real server on 127.0.0.1, and the requests of a client.
pub mod server;
