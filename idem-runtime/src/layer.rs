//! The layer that gives every request the `Idem` handle.

use std::task::{Context, Poll};

use http::Request;
use tower::{Layer, Service};

use crate::Idem;

impl Idem {
    /// The layer that puts this handle into every request's extensions.
    pub fn layer(&self) -> IdemLayer {
        IdemLayer::new(self.clone())
    }
}

/// A tower [`Layer`] that inserts an [`Idem`] handle into the extensions of every request,
/// where contracted handlers and status lookups find it. Made by [`Idem::layer`].
///
/// Without it, a contracted handler answers 500 `not-configured`.
#[derive(Clone, Debug)]
pub struct IdemLayer {
    idem: Idem,
}

impl IdemLayer {
    /// The layer for `idem`.
    pub fn new(idem: Idem) -> IdemLayer {
        IdemLayer { idem }
    }
}

impl<S> Layer<S> for IdemLayer {
    type Service = IdemService<S>;

    fn layer(&self, inner: S) -> IdemService<S> {
        IdemService {
            inner,
            idem: self.idem.clone(),
        }
    }
}

/// The service of [`IdemLayer`]: inserts the handle, then calls `inner`.
#[derive(Clone, Debug)]
pub struct IdemService<S> {
    inner: S,
    idem: Idem,
}

impl<S, B> Service<Request<B>> for IdemService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        request.extensions_mut().insert(self.idem.clone());
        self.inner.call(request)
    }
}
