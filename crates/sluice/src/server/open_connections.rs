//! A cap on the API's open connections. The server's accept loop asks the service maker to be
//! ready before it accepts the next connection; this maker is ready only while fewer than `most`
//! connections are open, so past the cap new connections wait in the kernel's backlog (no task,
//! no file descriptor of ours) until one closes. Each connection's service holds its slot until
//! the connection ends and its last clone is dropped.

use std::convert::Infallible;
use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;
use tower_service::Service;

/// Makes one connection's service out of the router, at most `most` at a time.
pub struct OpenConnections {
    router: Router,
    slots: PollSemaphore,
    /// The slot taken by `poll_ready` for the next connection.
    ready: Option<OwnedSemaphorePermit>,
}

impl OpenConnections {
    pub fn new(router: Router, most: usize) -> OpenConnections {
        OpenConnections { router, slots: PollSemaphore::new(Arc::new(Semaphore::new(most.max(1)))), ready: None }
    }
}

impl<Target> Service<Target> for OpenConnections {
    type Response = Connection;
    type Error = Infallible;
    type Future = Ready<Result<Connection, Infallible>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.ready.is_none() {
            match self.slots.poll_acquire(context) {
                Poll::Ready(Some(slot)) => self.ready = Some(slot),
                // The semaphore is never closed.
                Poll::Ready(None) => unreachable!("the connection slots are never closed"),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _target: Target) -> Self::Future {
        let slot = self.ready.take().expect("poll_ready took a slot before call");
        std::future::ready(Ok(Connection { router: self.router.clone(), _slot: Arc::new(slot) }))
    }
}

/// One connection's service: the router, and the connection's slot.
#[derive(Clone)]
pub struct Connection {
    router: Router,
    _slot: Arc<OwnedSemaphorePermit>,
}

impl<Request> Service<Request> for Connection
where
    Router: Service<Request>,
{
    type Response = <Router as Service<Request>>::Response;
    type Error = <Router as Service<Request>>::Error;
    type Future = <Router as Service<Request>>::Future;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        <Router as Service<Request>>::poll_ready(&mut self.router, context)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        self.router.call(request)
    }
}
