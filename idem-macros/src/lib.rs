//! idem-macros
