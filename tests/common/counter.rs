//! A count shared by the clones of an app state: the runs of a handler, the calls of a
//! reconcile function, the writes of an effect.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// A count shared by its clones.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicUsize>);

impl Counter {
    /// Counts one more, and returns the count with it (1 the first time).
    pub fn bump(&self) -> usize {
        self.0.fetch_add(1, SeqCst) + 1
    }

    /// The count so far.
    pub fn get(&self) -> usize {
        self.0.load(SeqCst)
    }
}
