//! idem-runtime
