//! What the tests of the payments service share: a payment provider of the tests' own
//! ([`provider::TestProvider`]), and the service's binary started as a process of its
//! own with its client's side ([`service::Service`], [`service::Reply`]).
//!
//! Each test file uses a part of it.
#![allow(dead_code, reason = "each test binary uses a part of the helpers")]

pub mod provider;
pub mod service;
