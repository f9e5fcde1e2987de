//! Connections: the accept loop under the HTTP API, with the limits a
//! server on a shared machine needs.
//!
//! - A connection must send its request headers within `header_timeout`
//!   (byte-by-byte senders are cut off) and its body within `body_timeout`.
//! - A connection with no request in flight and no bytes moving for
//!   `idle_timeout` is closed; a response being written, a stream
//!   included, counts as a request in flight.
//! - At most `max_connections` are served at once. Past that a small
//!   reserve of connections is still answered: `/health` as usual, every
//!   other request with a JSON 503 and `Retry-After`; past the reserve a
//!   new connection gets that 503 written at once and is closed. The
//!   default cap leaves file descriptors for the rest of the process, so
//!   idle clients cannot make `/health` fail with "Too many open files".
//! - On shutdown no connection is accepted, connections without a request
//!   in flight close at once, and the others close when their response
//!   ends.

use std::convert::Infallible;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use futures_util::FutureExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use crate::error::ApiError;
use crate::guarded_body::Guarded;

/// What a connection may take; flags of `spindle serve`.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// A request's headers must arrive within this.
    pub header_timeout: Duration,
    /// A request's body must arrive within this.
    pub body_timeout: Duration,
    /// A connection with nothing in flight and nothing moving is closed
    /// after this.
    pub idle_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            max_connections: connection_capacity(),
        }
    }
}

/// Connections answered past the cap (with 503, or `/health`), each given
/// [`SHED_WAIT`] to send its request.
const SHED_RESERVE: usize = 32;
const SHED_WAIT: Duration = Duration::from_secs(1);
/// How long a connection past the cap waits for the idle connection it
/// displaces to close.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// File descriptors kept for everything but served connections: the shed
/// reserve (32), the listener, the model file, logs and what
/// libraries open.
const FD_RESERVE: usize = 64;

/// The default connection cap: 1024, or fewer when the open-file limit
/// (raised to its hard maximum first) leaves less room.
pub fn connection_capacity() -> usize {
    static CAPACITY: OnceLock<usize> = OnceLock::new();
    *CAPACITY.get_or_init(|| {
        let files = raise_open_file_limit();
        files.saturating_sub(FD_RESERVE).clamp(1, 1024)
    })
}

/// Raises the soft open-file limit to the hard one, as servers do; returns
/// the limit in force.
#[cfg(unix)]
fn raise_open_file_limit() -> usize {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return lim.maximum.map_or(usize::MAX, |m| m as usize);
        }
    }
    lim.current.map_or(usize::MAX, |c| c as usize)
}

#[cfg(not(unix))]
fn raise_open_file_limit() -> usize {
    1024
}

/// Connections being served, for the shutdown to wait on and for room to
/// be made.
#[derive(Clone)]
pub(crate) struct OpenConnections {
    served: Arc<Semaphore>,
    shed: Arc<Semaphore>,
    /// Every served connection's activity.
    registry: Arc<Mutex<Vec<Arc<Activity>>>>,
    max: usize,
}

impl OpenConnections {
    /// Waits until every connection has closed.
    pub(crate) async fn all_closed(&self) {
        let _a = self.served.acquire_many(self.max as u32).await;
        let _b = self.shed.acquire_many(SHED_RESERVE as u32).await;
    }

    /// Asks the served connection idle longest, of those with no request
    /// in flight, to close; false when every one has a request in flight.
    fn evict_idlest(&self) -> bool {
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let idlest = registry
            .iter()
            .filter(|a| !a.busy() && !a.evicted.load(Ordering::Relaxed))
            .max_by_key(|a| a.idle_for());
        match idlest {
            Some(a) => {
                a.evicted.store(true, Ordering::Relaxed);
                a.evict.notify_one();
                true
            }
            None => false,
        }
    }

    fn register(&self, activity: &Arc<Activity>) -> Registered {
        self.registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(activity.clone());
        Registered {
            registry: self.registry.clone(),
            activity: activity.clone(),
        }
    }
}

/// A served connection's place in the registry, left when it closes.
struct Registered {
    registry: Arc<Mutex<Vec<Arc<Activity>>>>,
    activity: Arc<Activity>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = registry.iter().position(|a| Arc::ptr_eq(a, &self.activity)) {
            registry.swap_remove(at);
        }
    }
}

/// Accepts connections on `listener` and serves `app` on each until `stop`
/// turns true. The returned handle tells when every connection has closed.
pub(crate) fn spawn_accept_loop(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: watch::Receiver<bool>,
) -> (tokio::task::JoinHandle<()>, OpenConnections) {
    let max = limits.max_connections.max(1);
    let open = OpenConnections {
        served: Arc::new(Semaphore::new(max)),
        shed: Arc::new(Semaphore::new(SHED_RESERVE)),
        registry: Arc::new(Mutex::new(Vec::with_capacity(max))),
        max,
    };
    let server = Server {
        app,
        limits: Arc::new(limits),
        stop,
        open: open.clone(),
        busy: busy_bytes(max).into(),
        healthy: healthy_bytes().into(),
    };
    (tokio::spawn(server.accept_loop(listener)), open)
}

/// What every connection's task shares.
#[derive(Clone)]
struct Server {
    app: Router,
    limits: Arc<ConnectionLimits>,
    stop: watch::Receiver<bool>,
    open: OpenConnections,
    /// Whole HTTP responses for connections answered without being served.
    busy: Arc<[u8]>,
    healthy: Arc<[u8]>,
}

impl Server {
    async fn accept_loop(self, listener: TcpListener) {
        let mut stop = self.stop.clone();
        let mut warned_at: Option<Instant> = None;
        let mut warned_cap_at: Option<Instant> = None;
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors (or another passing
                        // fault): log at most every 10 s and let
                        // connections close.
                        if warned_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                            tracing::warn!("cannot accept a connection: {e}");
                            warned_at = Some(Instant::now());
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = stopped(&mut stop) => break,
            };
            let _ = stream.set_nodelay(true);
            match self.open.served.clone().try_acquire_owned() {
                Ok(permit) => {
                    tokio::spawn(self.clone().connection(stream, false, permit));
                }
                Err(_) => {
                    if warned_cap_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(
                            "{} connections are open, the most --max-connections allows: idle ones are closed to make room, and while none is idle new ones get 503",
                            self.open.max
                        );
                        warned_cap_at = Some(Instant::now());
                    }
                    tokio::spawn(self.clone().over_capacity(stream));
                }
            }
        }
    }

    /// A connection past the cap: served in the place of the idlest
    /// connection, which is closed; or, when every connection has a
    /// request in flight, answered from the reserve (`/health`, 503 for
    /// the rest); or, past the reserve too, answered at once.
    async fn over_capacity(self, stream: TcpStream) {
        if self.open.evict_idlest() {
            let room = self.open.served.clone().acquire_owned();
            if let Ok(Ok(permit)) = tokio::time::timeout(EVICTION_WAIT, room).await {
                return self.connection(stream, false, permit).await;
            }
        }
        match self.open.shed.clone().try_acquire_owned() {
            Ok(permit) => self.connection(stream, true, permit).await,
            Err(_) => answer_at_once(stream, &self.healthy, &self.busy),
        }
    }

    /// Serves one connection until it closes, times out idle, is evicted,
    /// or the server stops. `shedding`: the connection is past the cap and
    /// gets 503 for everything but `/health`.
    async fn connection(self, stream: TcpStream, shedding: bool, _permit: OwnedSemaphorePermit) {
        let activity = Arc::new(Activity {
            last: AtomicU64::new(now_ms()),
            in_flight: AtomicUsize::new(0),
            evicted: AtomicBool::new(false),
            evict: Notify::new(),
        });
        let _registered = (!shedding).then(|| self.open.register(&activity));
        let io = TokioIo::new(Watched {
            io: stream,
            activity: activity.clone(),
        });
        let max_connections = self.open.max;
        let service = hyper::service::service_fn({
            let activity = activity.clone();
            let app = self.app.clone();
            move |req: Request<Incoming>| {
                let in_flight = InFlight::begin(&activity);
                let app = app.clone();
                async move {
                    let req = req.map(Body::new);
                    let resp = if shedding && req.uri().path() != "/health" {
                        busy(max_connections).into_response()
                    } else {
                        // A handler that panics (a bug) answers 500 with a
                        // JSON body instead of resetting the connection.
                        match AssertUnwindSafe(app.oneshot(req)).catch_unwind().await {
                            Ok(Ok(r)) => r,
                            Ok(Err(never)) => match never {},
                            Err(_) => ApiError::new(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                "the server failed while handling this request (a bug: please report it)",
                            )
                            .into_response(),
                        }
                    };
                    // The request stays in flight until its body is written.
                    Ok::<_, Infallible>(resp.map(|body| Guarded {
                        body,
                        _guard: in_flight,
                    }))
                }
            }
        });
        let limits = &self.limits;
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_buf_size(HYPER_HEADER_BUFFER)
            .max_headers(HYPER_MAX_HEADERS)
            .keep_alive(!shedding);
        let conn = builder.serve_connection(io, service);
        tokio::pin!(conn);
        let idle_limit = if shedding {
            limits.header_timeout.min(SHED_WAIT)
        } else {
            limits.idle_timeout
        };
        let mut check = tokio::time::interval(
            idle_limit.clamp(Duration::from_millis(100), Duration::from_secs(1)),
        );
        let mut stop = self.stop.clone();
        let mut stopping = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!("connection ended: {e}");
                    }
                    return;
                }
                _ = check.tick() => {
                    let limit = if stopping { Duration::ZERO } else { idle_limit };
                    if !activity.busy() && activity.idle_for() >= limit {
                        return;
                    }
                }
                _ = activity.evict.notified() => {
                    if !activity.busy() {
                        return;
                    }
                }
                _ = stopped(&mut stop), if !stopping => {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                    if !activity.busy() {
                        return;
                    }
                }
            }
        }
    }
}
/// Answers a connection past every reserve without serving it, from
/// what it has sent already: `/health` if that is what it asks for, 503
/// otherwise.
fn answer_at_once(stream: TcpStream, healthy: &[u8], busy: &[u8]) {
    // All of it is read: closing a socket with unread bytes resets it, and
    // the client might lose the answer.
    let mut head = [0u8; 4096];
    let health =
        matches!(stream.try_read(&mut head), Ok(n) if head[..n].starts_with(b"GET /health "));
    while matches!(stream.try_read(&mut head), Ok(n) if n > 0) {}
    let _ = stream.try_write(if health { healthy } else { busy });
}

/// Returns once the server stops (or its stop signal is gone).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// When the connection last moved bytes and how many of its requests are
/// in flight.
struct Activity {
    /// Milliseconds since [`epoch`].
    last: AtomicU64,
    in_flight: AtomicUsize,
    /// Asked to close to make room for a new connection.
    evicted: AtomicBool,
    evict: Notify,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

impl Activity {
    fn touch(&self) {
        self.last.store(now_ms(), Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.last.load(Ordering::Relaxed)))
    }

    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }
}

/// A request in flight until its response has been written (or dropped).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.touch();
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The socket, noting every byte that moves.
struct Watched {
    io: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Headers past this many bytes (all of them) get 431 from hyper, without
/// a body; the API's own, lower limit answers with JSON first.
const HYPER_HEADER_BUFFER: usize = 256 * 1024;
/// Header fields past this many get 431 from hyper; the API's own limit
/// is lower.
const HYPER_MAX_HEADERS: usize = 256;

fn busy(max_connections: usize) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the server has {max_connections} connections open, the most it takes (--max-connections): retry shortly"),
        )
    }
}

/// `/health`'s answer (the same as the route's) as the bytes of a whole
/// HTTP response.
fn healthy_bytes() -> Vec<u8> {
    whole_response("200 OK", "", &crate::replies::health_body())
}

/// [`busy`] as the bytes of a whole HTTP response, for a connection that
/// is answered without being read.
fn busy_bytes(max_connections: usize) -> Vec<u8> {
    let e = busy(max_connections);
    whole_response("503 Service Unavailable", "retry-after: 1\r\n", &e.body())
}

/// An HTTP/1.1 response with a JSON body that closes the connection;
/// `headers` are extra lines, each ending in CRLF.
fn whole_response(status: &str, headers: &str, body: &serde_json::Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{headers}connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn exchange(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    /// A handler that panics answers a JSON 500, and the server goes on
    /// serving the next request.
    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_the_server_goes_on() {
        let app = Router::new()
            .route(
                "/boom",
                get(|| async {
                    if std::hint::black_box(true) {
                        panic!("a bug");
                    }
                    "unreachable"
                }),
            )
            .route("/health", get(|| async { "ok" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let (accepting, open) =
            spawn_accept_loop(listener, app, ConnectionLimits::default(), stopped);
        let r = exchange(
            addr,
            "GET /boom HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 500"), "{r}");
        assert!(r.contains("\"code\":500"), "{r}");
        let r = exchange(
            addr,
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        stop.send(true).unwrap();
        accepting.await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), open.all_closed())
            .await
            .expect("every connection closes once the server stops");
    }
}
