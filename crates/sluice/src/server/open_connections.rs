//! A cap on the API's open connections. The server's accept loop asks the service maker to be
//! ready before it accepts the next connection; this maker is ready only while fewer than `most`
//! connections are open, so past the cap new connections wait in the kernel's backlog (no task,
//! no file descriptor of ours) until one closes. Each connection's service holds its slot until
//! the connection ends and its last clone is dropped.

use std::convert::Infallible;
use std::future::Ready;
use std::net::SocketAddr;
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

impl Service<SocketAddr> for OpenConnections {
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

    fn call(&mut self, peer: SocketAddr) -> Self::Future {
        let slot = self.ready.take().expect("poll_ready took a slot before call");
        std::future::ready(Ok(Connection { router: self.router.clone(), peer, _slot: Arc::new(slot) }))
    }
}

/// One connection's service: the router, the client's address (each request carries it as
/// `ConnectInfo`, for the audit trail), and the connection's slot.
#[derive(Clone)]
pub struct Connection {
    router: Router,
    peer: SocketAddr,
    _slot: Arc<OwnedSemaphorePermit>,
}

impl<Body> Service<axum::http::Request<Body>> for Connection
where
    Router: Service<axum::http::Request<Body>>,
{
    type Response = <Router as Service<axum::http::Request<Body>>>::Response;
    type Error = <Router as Service<axum::http::Request<Body>>>::Error;
    type Future = <Router as Service<axum::http::Request<Body>>>::Future;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        <Router as Service<axum::http::Request<Body>>>::poll_ready(&mut self.router, context)
    }

    fn call(&mut self, mut request: axum::http::Request<Body>) -> Self::Future {
        request.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        self.router.call(request)
    }
}
