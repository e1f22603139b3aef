//! The header names that the server and its clients share, in one place: the server
//! writes them, the client (`idem-client`) reads them. HTTP header names are
//! case-insensitive (RFC 9110 §5.1); these are lowercase, as HTTP/2 and HTTP/3 send them.
//!
//! The idempotency key's header is the contract's own (`key_scope`), by default
//! [`crate::key::DEFAULT_KEY_HEADER`].

/// The response header that carries the operation id on every answer of a contracted
/// operation: one server-assigned, time-ordered id shared by every attempt of one business
/// operation.
pub const OPERATION_ID_HEADER: &str = "operation-id";

/// The header that marks a replayed result (the IETF draft "The Idempotency-Key HTTP
/// Header Field" and common practice): `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED_HEADER: &str = "idempotent-replayed";
