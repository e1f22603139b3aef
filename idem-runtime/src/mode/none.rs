//! Without a SQL store there is no transactional mode: its arm of [`super::Mode`] holds
//! this uninhabited type, whose methods are never called.

use http::Extensions;

use crate::store::{BeginInTx, InFlight, NewRecord, RecordKey, StoreError, UnixMillis};

/// The transaction of an attempt: none can exist without the features `sqlite` or
/// `postgres`.
#[derive(Clone)]
pub(crate) enum AttemptTx {}

/// A key's mark in flight: none without a transactional store.
pub(crate) enum KeyMark {}

impl AttemptTx {
    /// Never finds one.
    pub(crate) fn find(_extensions: &Extensions) -> Option<AttemptTx> {
        None
    }

    pub(crate) async fn try_reserve(&self) -> bool {
        match *self {}
    }

    pub(crate) async fn reserve(&self) -> Result<(), StoreError> {
        match *self {}
    }

    pub(crate) fn mark(
        &self,
        _key: &RecordKey,
        _attempt: InFlight,
    ) -> Option<Result<KeyMark, InFlight>> {
        match *self {}
    }

    pub(crate) async fn reserve_marked(&self, mark: KeyMark) -> Result<(), StoreError> {
        match mark {}
    }

    pub(crate) async fn begin(&self, _until: tokio::time::Instant) -> Result<(), StoreError> {
        match *self {}
    }

    pub(crate) async fn defer(
        &self,
        _until: tokio::time::Instant,
        _on_open: Box<dyn FnOnce() + Send + Sync>,
    ) {
        match *self {}
    }

    pub(crate) fn fences_by_lock(&self) -> bool {
        match *self {}
    }

    pub(crate) async fn register(
        &self,
        _key: &RecordKey,
        _new: &NewRecord,
        _now: UnixMillis,
        _until: tokio::time::Instant,
    ) -> Result<BeginInTx, StoreError> {
        match *self {}
    }

    pub(crate) async fn in_flight(&self, _key: &RecordKey) -> Result<Option<InFlight>, StoreError> {
        match *self {}
    }

    pub(crate) async fn is_reserved(&self) -> bool {
        match *self {}
    }
}
