//! The header names that the server and its clients share, in one place: the server
//! writes them, the client (`idem-client`) reads them, the conformance harness sends
//! them. HTTP header names are case-insensitive (RFC 9110 §5.1).

/// The request header that carries the idempotency key unless the contract's `key_scope`
/// names another: `Idempotency-Key`, as the IETF draft "The Idempotency-Key HTTP Header
/// Field" spells it (and as the published contract shows it).
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// The response header that carries the operation id on every answer of a contracted
/// operation: one server-assigned, time-ordered id shared by every attempt of one business
/// operation.
pub const OPERATION_ID: &str = "operation-id";

/// The response header that marks a replayed result (the IETF draft "The Idempotency-Key
/// HTTP Header Field" and common practice): `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The request header of the test-fault protocol, by which the conformance harness asks
/// an attempt to fail in a given way. A service honours it only under test (idem's
/// runtime: a handle built with `test_faults`, feature `testing`).
pub const TEST_FAULT: &str = "idem-test-fault";
