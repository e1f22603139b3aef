//! [`forward_store!`](crate::forward_store): the impls of [`RecordStore`] and
//! [`OperatorStore`] for a type that wraps another store, written once; and its use for
//! `Arc<T>`.

use std::sync::Arc;

use super::{OperatorStore, RecordStore};

/// Implements [`RecordStore`](crate::store::RecordStore) or
/// [`OperatorStore`](crate::store::OperatorStore) for a type that wraps another store:
/// every method of the trait that the block does not write itself is forwarded to the
/// inner store, so that a wrapper writes only the methods it changes.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// use idem_runtime::store::{
///     Begin, MemoryStore, NewRecord, RecordKey, Store, StoreError, UnixMillis,
/// };
///
/// /// Counts the registrations of the store it wraps.
/// struct Counted<S> {
///     inner: S,
///     begins: AtomicU64,
/// }
///
/// idem_runtime::forward_store! {
///     impl[S: Store] RecordStore for Counted<S> {
///         // `this` is `&self`; the expression is the inner store, as a reference.
///         forward |this| &this.inner;
///
///         // Written here; every other method of `RecordStore` is forwarded.
///         async fn begin(
///             &self,
///             key: &RecordKey,
///             new: &NewRecord,
///             now: UnixMillis,
///         ) -> Result<Begin, StoreError> {
///             self.begins.fetch_add(1, Ordering::Relaxed);
///             self.inner.begin(key, new, now).await
///         }
///     }
///     impl[S: Store] OperatorStore for Counted<S> {
///         forward |this| &this.inner;
///     }
/// }
///
/// let counted = Counted { inner: MemoryStore::new(), begins: AtomicU64::new(0) };
/// let _store: Box<dyn Store> = Box::new(counted);
/// ```
///
/// `impl[...]` holds the impl's generic parameters (`impl[]` for none). The methods
/// written in a block are `async fn`s as in an `#[async_trait]` impl (the macro puts the
/// block under `async_trait`). A forwarded method calls the trait's method on the
/// reference the `forward` expression gives: for an `Arc` field, `&*this.inner`, since
/// through the `Arc` itself the call would box its future once more.
#[doc(hidden)]
#[macro_export]
macro_rules! forward_store {
    // Each impl of the invocation on its own.
    ($(
        impl [$($generics:tt)*] $trait:ident for $ty:ty {
            forward |$this:ident| $inner:expr;
            $($items:tt)*
        }
    )*) => {$(
        $crate::forward_store!(@names
            {$trait [$($generics)*] [$ty] [$this $inner] [$($items)*]} [] $($items)*
        );
    )*};

    // The names of the methods the block writes.
    (@names $ctx:tt [$($names:ident)*]
        $(#[$meta:meta])* async fn $name:ident $args:tt -> $ret:ty $body:block $($rest:tt)*
    ) => {
        $crate::forward_store!(@names $ctx [$($names)* $name] $($rest)*);
    };
    (@names $ctx:tt [$($names:ident)*]
        $(#[$meta:meta])* fn $name:ident $args:tt -> $ret:ty $body:block $($rest:tt)*
    ) => {
        $crate::forward_store!(@names $ctx [$($names)* $name] $($rest)*);
    };
    (@names {RecordStore $($ctx:tt)*} $names:tt) => {
        $crate::forward_store!(@each {RecordStore $($ctx)*} $names [] [] [
            {reads_locally sync}
            {begin [key: &$crate::store::RecordKey, new: &$crate::store::NewRecord,
                now: $crate::store::UnixMillis] [$crate::store::Begin]}
            {get [key: &$crate::store::RecordKey, now: $crate::store::UnixMillis]
                [::core::option::Option<$crate::store::Record>]}
            {complete [key: &$crate::store::RecordKey, token: $crate::store::OwnerToken,
                response: &$crate::store::StoredResponse, now: $crate::store::UnixMillis] [()]}
            {release [key: &$crate::store::RecordKey, token: $crate::store::OwnerToken,
                now: $crate::store::UnixMillis] [()]}
            {renew [key: &$crate::store::RecordKey, token: $crate::store::OwnerToken,
                until: $crate::store::UnixMillis, now: $crate::store::UnixMillis] [()]}
            {park_unknown [key: &$crate::store::RecordKey, token: $crate::store::OwnerToken,
                reason: &str, now: $crate::store::UnixMillis] [()]}
            {take_over [key: &$crate::store::RecordKey, expected: $crate::store::OwnerToken,
                new_lease: $crate::store::Lease, now: $crate::store::UnixMillis]
                [$crate::store::Record]}
            {clock [] [::core::option::Option<$crate::store::UnixMillis>]}
            {client_usage [client: &str, cap: u64, now: $crate::store::UnixMillis]
                [$crate::store::ClientUsage]}
            {steps [key: &$crate::store::RecordKey, operation_id: $crate::OperationId,
                now: $crate::store::UnixMillis] [::std::vec::Vec<$crate::store::Step>]}
            {write_step [key: &$crate::store::RecordKey, token: $crate::store::OwnerToken,
                write: &$crate::store::StepWrite, now: $crate::store::UnixMillis]
                [$crate::store::Step]}
        ]);
    };
    (@names {OperatorStore $($ctx:tt)*} $names:tt) => {
        $crate::forward_store!(@each {OperatorStore $($ctx)*} $names [] [] [
            {list [query: &$crate::store::ListQuery, now: $crate::store::UnixMillis]
                [::std::vec::Vec<$crate::store::Listed>]}
            {inspect [key: &$crate::store::RecordKey, now: $crate::store::UnixMillis]
                [::core::option::Option<$crate::store::Inspection>]}
            {resolve [key: &$crate::store::RecordKey, resolve: &$crate::store::Resolution,
                now: $crate::store::UnixMillis] [$crate::store::Record]}
            {purge_expired [now: $crate::store::UnixMillis] [u64]}
            {due_deliveries [limit: u32, now: $crate::store::UnixMillis]
                [::std::vec::Vec<$crate::store::Due>]}
            {claim_delivery [key: &$crate::store::RecordKey, operation_id: $crate::OperationId,
                index: u32, until: $crate::store::UnixMillis, now: $crate::store::UnixMillis]
                [$crate::store::Step]}
            {settle_delivery [key: &$crate::store::RecordKey, operation_id: $crate::OperationId,
                index: u32, claim: u32, delivery: $crate::store::Delivery,
                now: $crate::store::UnixMillis] [$crate::store::Step]}
        ]);
    };

    // Each method of the trait, `{name [parameters] [output]}` (or `{name sync}` for a
    // method that is not async and returns `bool`): forwarded (added to the third group,
    // or the fourth) unless the block writes it.
    (@each $ctx:tt $names:tt $forwarded:tt $sync:tt []) => {
        $crate::forward_store!(@impl $ctx $forwarded $sync);
    };
    (@each $ctx:tt $names:tt $forwarded:tt $sync:tt [$method:tt $($todo:tt)*]) => {
        $crate::forward_store!(@written $method $names $ctx $names $forwarded $sync [$($todo)*]);
    };

    // Whether the block writes `method`: its name is among the names (one rule a name,
    // since macro_rules compares an identifier only with one written out). A method added
    // to a trait gets its line in the trait's table above and its rule here.
    (@written {reads_locally $($_s:tt)*} [reads_locally $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {begin $($_s:tt)*} [begin $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {get $($_s:tt)*} [get $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {complete $($_s:tt)*} [complete $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {release $($_s:tt)*} [release $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {renew $($_s:tt)*} [renew $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {park_unknown $($_s:tt)*} [park_unknown $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {take_over $($_s:tt)*} [take_over $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {clock $($_s:tt)*} [clock $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {client_usage $($_s:tt)*} [client_usage $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {steps $($_s:tt)*} [steps $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {write_step $($_s:tt)*} [write_step $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {list $($_s:tt)*} [list $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {inspect $($_s:tt)*} [inspect $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {resolve $($_s:tt)*} [resolve $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {purge_expired $($_s:tt)*} [purge_expired $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {due_deliveries $($_s:tt)*} [due_deliveries $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {claim_delivery $($_s:tt)*} [claim_delivery $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written {settle_delivery $($_s:tt)*} [settle_delivery $($_n:tt)*] $($k:tt)*) => {
        $crate::forward_store!(@each $($k)*);
    };
    (@written $method:tt [$_name:ident $($names:ident)*] $($k:tt)*) => {
        $crate::forward_store!(@written $method [$($names)*] $($k)*);
    };
    (@written {$name:ident sync} [] $ctx:tt $names:tt $forwarded:tt [$($sync:ident)*] $todo:tt) => {
        $crate::forward_store!(@each $ctx $names $forwarded [$($sync)* $name] $todo);
    };
    (@written $method:tt [] $ctx:tt $names:tt [$($forwarded:tt)*] $sync:tt $todo:tt) => {
        $crate::forward_store!(@each $ctx $names [$($forwarded)* $method] $sync $todo);
    };

    // The impl: the block's methods, then the forwarded ones.
    (@impl {$trait:ident [$($generics:tt)*] [$ty:ty] [$this:ident $inner:expr] [$($items:tt)*]}
        [$({$method:ident [$($param:ident: $param_ty:ty),*] [$output:ty]})*]
        [$($sync:ident)*]
    ) => {
        #[$crate::__private::async_trait]
        impl<$($generics)*> $crate::store::$trait for $ty {
            $($items)*
            $(
                fn $sync(&self) -> bool {
                    let $this = self;
                    $crate::store::$trait::$sync($inner)
                }
            )*
            $(
                async fn $method(
                    &self,
                    $($param: $param_ty),*
                ) -> ::core::result::Result<$output, $crate::store::StoreError> {
                    let $this = self;
                    $crate::store::$trait::$method($inner, $($param),*).await
                }
            )*
        }
    };
}

crate::forward_store! {
    impl[T: RecordStore + ?Sized] RecordStore for Arc<T> {
        forward |this| &**this;
    }
    impl[T: OperatorStore + ?Sized] OperatorStore for Arc<T> {
        forward |this| &**this;
    }
}
