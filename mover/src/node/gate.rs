//! The gate every request to the node service passes before its message is read: a `Put`
//! waits for a Put slot (the service's and its client's, [`super::shares`]) *before* its 4 MiB
//! body is received; its body must keep coming (no pause longer than [`PUT_BODY_IDLE`]) and the
//! whole Put be done within [`PUT_DEADLINE`]. Bodies waiting at the gate stay with the client
//! and in the connection's HTTP/2 window, so the memory Puts take is bounded by the slots and
//! the windows, however many connections send them, and a client that stops in the middle of
//! a body holds its slot for seconds. Every request also marks its connection in use, so it is
//! not closed as idle under it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::Status;

use super::shares::{Shares, TURN_WAIT, busy};
use crate::net::PeerIdentity;

/// The longest a Put may take from its turn until the block is stored.
pub const PUT_DEADLINE: Duration = Duration::from_secs(30);
/// The longest pause in a Put's body: Puts come from receivers on this node, whose bytes
/// never pause that long; a client that stops in the middle of a body gives its slot back.
pub const PUT_BODY_IDLE: Duration = Duration::from_secs(2);

const PUT_PATH: &str = "/ferry.blockstore.v1.BlockStore/Put";

/// The lease and share name of a request's client: its certificate's transfer id.
pub fn client_of(extensions: &http::Extensions) -> String {
    extensions
        .get::<PeerIdentity>()
        .and_then(|p| p.identity.as_ref())
        .map_or_else(|| "unknown".to_owned(), |i| i.transfer_id.clone())
}

#[derive(Clone)]
pub struct GateLayer(pub Arc<Shares>);

impl<S> tower::Layer<S> for GateLayer {
    type Service = Gate<S>;
    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            inner,
            shares: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Gate<S> {
    inner: S,
    shares: Arc<Shares>,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, R> tower::Service<http::Request<tonic::body::Body>> for Gate<S>
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        // The clone that was made ready is the one called (tower's rule for cloned services).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let in_use = req
            .extensions()
            .get::<PeerIdentity>()
            .map(|p| p.activity.begin());
        if req.uri().path() != PUT_PATH {
            return Box::pin(async move {
                let _in_use = in_use;
                inner.call(req).await
            });
        }
        let share = self.shares.of(&client_of(req.extensions()));
        let req = req.map(|b| tonic::body::Body::new(Steady::new(b, PUT_BODY_IDLE)));
        Box::pin(async move {
            let _in_use = in_use;
            let Some(_turn) = share.puts.acquire(TURN_WAIT).await else {
                return Ok(busy("every Put slot is taken").into_http());
            };
            match tokio::time::timeout(PUT_DEADLINE, inner.call(req)).await {
                Ok(reply) => reply,
                Err(_) => Ok(Status::deadline_exceeded(format!(
                    "the block did not arrive within {} s",
                    PUT_DEADLINE.as_secs()
                ))
                .into_http()),
            }
        })
    }
}

/// A request body that fails when no frame comes for `idle` once it is being read. One timer
/// for the body's life, moved on with each frame (not one per frame).
struct Steady {
    inner: tonic::body::Body,
    idle: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A frame came since the timer was last set.
    moved: bool,
}

impl Steady {
    fn new(inner: tonic::body::Body, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            timer: None,
            moved: false,
        }
    }
}

impl http_body::Body for Steady {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.moved = true;
            return Poll::Ready(frame);
        }
        let idle = this.idle;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if std::mem::take(&mut this.moved) {
            timer.as_mut().reset(tokio::time::Instant::now() + idle);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the block stopped arriving for {} s",
                idle.as_secs()
            ))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
