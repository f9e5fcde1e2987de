//! The native half of the Python package `spindle`.
//!
//! [`Engine`] starts what `spindle serve` starts (same flags, defaults,
//! memory checks and model pull) and answers the server's API in this
//! process: a call is a request handed to the server's router with no
//! socket in between, so every answer, error message and stream is the one
//! a client of `spindle serve` gets. The Python layer
//! (`python/spindle/llama.py`) shapes llama-cpp-python's API onto it.
//!
//! Every call releases the GIL while the engine works, so Python threads
//! calling one engine share its continuous batch. A call waits in short
//! slices and checks for Python signals between them: Ctrl-C cancels the
//! request (its future is dropped, which frees its sequence), as does
//! dropping a stream.

use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tower::ServiceExt;

/// How long a blocked call waits before it looks for Ctrl-C again.
const SIGNAL_POLL: Duration = Duration::from_millis(50);
/// Events a stream may run ahead of its Python reader.
const STREAM_AHEAD: usize = 64;

/// A model loaded and served in this process.
#[pyclass(module = "spindle._native", frozen)]
struct Engine {
    app: axum::Router,
    /// The model name requests carry as `model`.
    #[pyo3(get)]
    name: String,
    /// Threads, context, KV pool and drafts, in words.
    #[pyo3(get)]
    summary: String,
    // Last: dropping the runtime stops the tasks that hold the engine.
    rt: Runtime,
}

#[pymethods]
impl Engine {
    /// Starts an engine with `spindle serve`'s flags (`argv`, without the
    /// command name); the address, key and connection flags do nothing here.
    #[new]
    fn new(py: Python<'_>, argv: Vec<String>) -> PyResult<Self> {
        let args = spindle_cli::commands::serve::args_from(&argv)
            .map_err(|e| PyValueError::new_err(e.render().to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("spindle-py")
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start a runtime: {e}")))?;
        let prepared = py
            .detach(|| spindle_cli::commands::serve::prepare(&args))
            .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
        let mut state = prepared.state;
        // Whoever holds the object is the process's own code: a key (say
        // from SPINDLE_API_KEY) guards sockets, and there is none here.
        state.api_key = None;
        let app = {
            let _inside = rt.enter();
            spindle_server::in_process(state)
        };
        Ok(Engine {
            app,
            name: prepared.name,
            summary: prepared.summary,
            rt,
        })
    }

    /// One request: `(status, body)`. `body` is JSON text (or None).
    #[pyo3(signature = (method, path, body=None))]
    fn request(
        &self,
        py: Python<'_>,
        method: &str,
        path: &str,
        body: Option<String>,
    ) -> PyResult<(u16, String)> {
        let req = build_request(method, path, body)?;
        let app = self.app.clone();
        let mut task = self.rt.spawn(async move {
            let resp = app.oneshot(req).await.unwrap_or_else(|e| match e {});
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.map(|c| c.to_bytes());
            bytes
                .map(|b| (status, String::from_utf8_lossy(&b).into_owned()))
                .map_err(|e| e.to_string())
        });
        let done = wait(py, &self.rt, &mut task)?;
        done.map_err(|e| PyRuntimeError::new_err(format!("the request failed: {e}")))
    }

    /// A streaming request: `(status, body, events)`. When the server
    /// answers with an event stream, `events` yields each event's `data`
    /// (`[DONE]` ends it) and `body` is empty; otherwise `events` is None
    /// and `body` holds the answer (an error).
    fn stream(
        &self,
        py: Python<'_>,
        path: &str,
        body: String,
    ) -> PyResult<(u16, String, Option<EventStream>)> {
        let req = build_request("POST", path, Some(body))?;
        let app = self.app.clone();
        let (head_tx, head_rx) = tokio::sync::oneshot::channel();
        let (tx, rx) = mpsc::channel(STREAM_AHEAD);
        let task = self.rt.spawn(async move {
            let resp = app.oneshot(req).await.unwrap_or_else(|e| match e {});
            let status = resp.status();
            let is_events = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut body = resp.into_body();
            if status != StatusCode::OK || !is_events {
                let text = match body.collect().await {
                    Ok(c) => String::from_utf8_lossy(&c.to_bytes()).into_owned(),
                    Err(e) => e.to_string(),
                };
                let _ = head_tx.send((status.as_u16(), text, false));
                return;
            }
            if head_tx
                .send((status.as_u16(), String::new(), true))
                .is_err()
            {
                return;
            }
            forward_events(&mut body, &tx).await;
        });
        let mut head = self.rt.spawn(async move { head_rx.await.ok() });
        let head = wait(py, &self.rt, &mut head);
        let Ok(Some((status, text, is_events))) = head else {
            task.abort();
            return match head {
                Err(e) => Err(e),
                _ => Err(PyRuntimeError::new_err(
                    "the request ended before its answer",
                )),
            };
        };
        let events = is_events.then(|| EventStream {
            rt: self.rt.handle().clone(),
            inner: Mutex::new(Some((rx, task))),
        });
        Ok((status, text, events))
    }
}

/// The `data` of each server-sent event, in order, until `[DONE]` or the
/// end of the body; stops early when the reader is gone.
async fn forward_events(body: &mut Body, tx: &mpsc::Sender<Result<String, String>>) {
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let frame = match body.frame().await {
            None => return,
            Some(Err(e)) => {
                let _ = tx.send(Err(e.to_string())).await;
                return;
            }
            Some(Ok(f)) => f,
        };
        let Ok(bytes) = frame.into_data() else {
            continue;
        };
        pending.extend_from_slice(&bytes);
        while let Some(end) = find_event_end(&pending) {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                continue; // a comment (keep-alive)
            }
            let data = data.join("\n");
            if data == "[DONE]" {
                return;
            }
            if tx.send(Ok(data)).await.is_err() {
                return;
            }
        }
    }
}

/// Where the first event of `buf` ends (the blank line after it).
fn find_event_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n")
}

/// The events of a streaming request, as a Python iterator of JSON texts.
/// Dropping it (or `close()`) cancels the request.
#[pyclass(module = "spindle._native", frozen)]
struct EventStream {
    rt: tokio::runtime::Handle,
    #[allow(clippy::type_complexity)]
    inner: Mutex<Option<(mpsc::Receiver<Result<String, String>>, JoinHandle<()>)>>,
}

#[pymethods]
impl EventStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        loop {
            let got = py.detach(|| {
                let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                let Some((rx, _)) = guard.as_mut() else {
                    return Some(None);
                };
                let got = self
                    .rt
                    .block_on(async { tokio::time::timeout(SIGNAL_POLL, rx.recv()).await });
                let got = got.ok();
                if matches!(got, Some(None)) {
                    *guard = None; // the request finished
                }
                got
            });
            match got {
                Some(None) => return Ok(None),
                Some(Some(Ok(data))) => return Ok(Some(data)),
                Some(Some(Err(e))) => {
                    self.close();
                    return Err(PyRuntimeError::new_err(format!("the stream broke: {e}")));
                }
                None => {
                    if let Err(interrupted) = py.check_signals() {
                        self.close();
                        return Err(interrupted);
                    }
                }
            }
        }
    }

    /// Stops reading and cancels the request.
    fn close(&self) {
        let taken = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((_, task)) = taken {
            task.abort();
        }
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        self.close();
    }
}

fn build_request(method: &str, path: &str, body: Option<String>) -> PyResult<Request<Body>> {
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| PyValueError::new_err(format!("'{method}' is not an HTTP method")))?;
    let mut req = Request::builder().method(method).uri(path);
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    req.body(body.map_or_else(Body::empty, Body::from))
        .map_err(|e| PyValueError::new_err(format!("'{path}' is not a request path: {e}")))
}

/// Waits for `task` without holding the GIL, looking for Ctrl-C (or any
/// signal Python raises for) between slices; on one the task is cancelled.
fn wait<T: Send + 'static>(py: Python<'_>, rt: &Runtime, task: &mut JoinHandle<T>) -> PyResult<T> {
    loop {
        let got = py
            .detach(|| rt.block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut *task).await }));
        match got {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) => {
                return Err(PyRuntimeError::new_err(format!(
                    "the engine's task failed: {e}"
                )))
            }
            Err(_) => {
                if let Err(interrupted) = py.check_signals() {
                    task.abort();
                    return Err(interrupted);
                }
            }
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<EventStream>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
