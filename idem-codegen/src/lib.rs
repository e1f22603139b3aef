//! idem-codegen
