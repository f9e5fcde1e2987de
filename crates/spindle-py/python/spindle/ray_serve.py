"""Spindle on Ray Serve: one engine per replica, across machines.

    from spindle.ray_serve import build_app
    serve.run(build_app(model_path=None, n_threads=4, num_replicas=2))

- ``SpindleServer`` hosts one ``spindle.Llama`` per replica, with an explicit
  thread count that is also the replica's ``num_cpus`` (rayon and Spindle's
  pool do not read ``OMP_NUM_THREADS``). Its calls are the requests of
  ``spindle serve``'s API, answered by the engine in process, so the
  answers and errors are the server's own.
- ``Ingress`` is an OpenAI-compatible FastAPI app: ``/v1/chat/completions``,
  ``/v1/completions`` (both streaming), ``/v1/decide``, ``/v1/embeddings``,
  ``/v1/models``, ``/tokenize``, ``/detokenize``; ``/metrics`` gathers every
  replica's metrics with a ``replica`` label; ``/replicas`` lists them and
  ``/replicas/{id}/metrics`` reads one. Each answer names its replica in
  the ``x-spindle-replica`` header.
- ``PrefixAffinityRouter`` (Ray's public ``RequestRouter``) sends the turns
  of a conversation to the replica that holds its prefix in its KV cache:
  replicas are ranked by rendezvous hashing of the conversation's start
  (system prompt and first user turn, or a completion prompt's first
  characters), so every ingress replica picks the same one without shared
  state, a replica that leaves moves only its own conversations, and a
  replica at its ``max_ongoing_requests`` passes the request to the next in
  rank.

Faults: a request in flight on a replica that dies ends with a clean error
(HTTP 503, or an ``error`` event then the end of a stream); the client
retries it (``openai``'s client retries a 503 itself; see the README's
"Beyond one machine" for a stream that broke midway).
"""

import asyncio
import hashlib
import importlib
import json
import re
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from .llama import Llama, SpindleError

# Characters of a completion prompt that name its conversation.
_PROMPT_KEY_CHARS = 256


def conversation_key(body: Dict[str, Any]) -> Optional[str]:
    """What a conversation's requests share from their first turn on: the
    messages up to the first user turn, or the start of a prompt."""
    messages = body.get("messages")
    if isinstance(messages, list) and messages:
        start = []
        for m in messages:
            start.append(m)
            if isinstance(m, dict) and m.get("role") == "user":
                break
        return json.dumps(start, sort_keys=True)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:_PROMPT_KEY_CHARS]
    if isinstance(prompt, list):
        return json.dumps(prompt[:_PROMPT_KEY_CHARS])
    if "state" in body:  # a decision: the state is the prefix
        return json.dumps(body["state"], sort_keys=True)[:_PROMPT_KEY_CHARS]
    return None


def _score(key: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


# Replicas the router of this process knows: id -> node id (the ingress
# fans /metrics out over them).
LIVE_REPLICAS: Dict[str, str] = {}


def _live_replicas() -> Dict[str, str]:
    """:data:`LIVE_REPLICAS`, read through the imported module: Serve ships
    the router and the ingress by value, each with its own copy of this
    module's names."""
    return importlib.import_module(__name__).LIVE_REPLICAS


class PrefixAffinityRouter(RequestRouter):
    """Ranks the replicas for a request by rendezvous hashing of its
    conversation's start; requests without one (and a ``target`` naming a
    replica gone) go to the least loaded of two, as Ray's default does.
    A call with ``target=<replica id>`` goes to that replica only."""

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = _live_replicas()
        live.clear()
        live.update({r.replica_id.unique_id: r.node_id for r in replicas})

    async def choose_replicas(
        self,
        candidate_replicas: List[RunningReplica],
        pending_request: Optional[PendingRequest] = None,
    ) -> List[List[RunningReplica]]:
        if not candidate_replicas:
            return []
        args = pending_request.args if pending_request is not None else []
        kwargs = pending_request.kwargs if pending_request is not None else {}
        target = kwargs.get("target")
        if target is not None:
            return [[r for r in candidate_replicas if r.replica_id.unique_id == target]]
        body = next((a for a in args if isinstance(a, dict)), None)
        key = conversation_key(body) if body is not None else None
        if key is None:
            return [candidate_replicas]
        ranked = sorted(candidate_replicas, key=lambda r: _score(key, r.replica_id.unique_id), reverse=True)
        return [[r] for r in ranked]


class SpindleServer:
    """One Spindle engine per replica (deployed by :func:`build_app`)."""

    def __init__(self, model_path: Optional[str], n_threads: int, llama_kwargs: Dict[str, Any]):
        self.llm = Llama(model_path, n_threads=n_threads, verbose=False, **llama_kwargs)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()

    async def call(self, method: str, path: str, body: Optional[Dict[str, Any]]) -> Tuple[int, str, str]:
        """``(status, JSON text, replica)`` of one request."""
        text = None if body is None else json.dumps(body)
        status, answer = await asyncio.to_thread(self.llm._engine.request, method, path, text)
        return status, answer, self.replica

    async def stream(self, path: str, body: Dict[str, Any]) -> AsyncIterator[Any]:
        """First ``(status, error text or None, replica)``, then each event's
        data. Cancelling the generator cancels the request."""
        status, text, events = await asyncio.to_thread(self.llm._engine.stream, path, json.dumps(body))
        if events is None:
            yield (status, text, self.replica)
            return
        yield (status, None, self.replica)
        try:
            while True:
                data = await asyncio.to_thread(next, events, None)
                if data is None:
                    return
                yield data
        finally:
            events.close()

    def metrics(self, target: Optional[str] = None) -> Tuple[str, str, str]:
        """``(replica, node, Prometheus text)``."""
        return self.replica, self.node, self.llm.metrics()


_LABELLED = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(.*)$")


def label_replica(text: str, replica: str) -> str:
    """Prometheus text with ``replica="..."`` added to every sample."""
    out = []
    for line in text.splitlines():
        m = _LABELLED.match(line)
        if line.startswith("#") or m is None:
            out.append(line)
            continue
        name, labels, value = m.groups()
        inner = labels[1:-1] + "," if labels and labels != "{}" else ""
        out.append(f'{name}{{{inner}replica="{replica}"}} {value}')
    return "\n".join(out) + "\n"


def _error(status: int, message: str, kind: str = "server_error") -> Dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# Exceptions that mean the replica (or its node) went away mid-request.
_LOST = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.RayTaskError)

app = FastAPI(title="Spindle on Ray Serve")


@serve.ingress(app)
class Ingress:
    """The OpenAI-compatible front (deployed by :func:`build_app`)."""

    def __init__(self, server: DeploymentHandle, api_key: Optional[str] = None):
        self.server = server
        self.api_key = api_key

    def _refused(self, request: Request) -> Optional[JSONResponse]:
        if self.api_key is None:
            return None
        if request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            return JSONResponse(_error(401, "missing or wrong API key: send Authorization: Bearer KEY", "authentication_error"), 401)
        return None

    async def _forward(self, request: Request, path: str):
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse(_error(400, "the body is not JSON", "invalid_request_error"), 400)
        if not isinstance(body, dict):
            return JSONResponse(_error(400, "the body must be a JSON object", "invalid_request_error"), 400)
        if body.get("stream"):
            return await self._stream(path, body)
        try:
            status, text, replica = await self.server.call.remote("POST", path, body)
        except _LOST as e:
            return JSONResponse(_error(503, f"the replica serving this request was lost ({type(e).__name__}); retry it"), 503)
        return PlainTextResponse(text, status, media_type="application/json", headers={"x-spindle-replica": replica})

    async def _stream(self, path: str, body: Dict[str, Any]):
        gen = self.server.options(stream=True).stream.remote(path, body)
        try:
            status, error, replica = await gen.__anext__()
        except (StopAsyncIteration, *_LOST) as e:
            return JSONResponse(_error(503, f"the replica serving this request was lost ({type(e).__name__}); retry it"), 503)
        if error is not None:
            return PlainTextResponse(error, status, media_type="application/json", headers={"x-spindle-replica": replica})

        async def events() -> AsyncIterator[bytes]:
            try:
                async for data in gen:
                    yield f"data: {data}\n\n".encode()
                yield b"data: [DONE]\n\n"
            except _LOST as e:
                lost = _error(503, f"the replica serving this stream was lost ({type(e).__name__}); retry the request")
                yield f"data: {json.dumps(lost)}\n\n".encode()
            finally:
                gen.cancel()

        return StreamingResponse(events(), media_type="text/event-stream", headers={"x-spindle-replica": replica})

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._forward(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._forward(request, "/v1/completions")

    @app.post("/v1/decide")
    async def decide(self, request: Request):
        return await self._forward(request, "/v1/decide")

    @app.post("/v1/embeddings")
    async def embeddings(self, request: Request):
        return await self._forward(request, "/v1/embeddings")

    @app.post("/tokenize")
    async def tokenize(self, request: Request):
        return await self._forward(request, "/tokenize")

    @app.post("/detokenize")
    async def detokenize(self, request: Request):
        return await self._forward(request, "/detokenize")

    @app.get("/v1/models")
    async def models(self, request: Request):
        refused = self._refused(request)
        if refused is not None:
            return refused
        status, text, _ = await self.server.call.remote("GET", "/v1/models", None)
        return PlainTextResponse(text, status, media_type="application/json")

    @app.get("/health")
    async def health(self):
        return {"status": "ok", "replicas": len(_live_replicas())}

    @app.get("/replicas")
    async def replicas(self):
        return {"replicas": [{"id": r, "node_id": n} for r, n in sorted(_live_replicas().items())]}

    @app.get("/replicas/{replica}/metrics")
    async def replica_metrics(self, replica: str):
        if replica not in _live_replicas():
            return JSONResponse(_error(404, f"no replica {replica}: GET /replicas lists them", "invalid_request_error"), 404)
        try:
            _, _, text = await self.server.metrics.remote(target=replica)
        except _LOST as e:
            return JSONResponse(_error(503, f"replica {replica} was lost ({type(e).__name__})"), 503)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/metrics")
    async def metrics(self):
        calls = [self.server.metrics.remote(target=r) for r in list(_live_replicas())]
        parts = []
        for call in calls:
            try:
                replica, _, text = await call
            except _LOST:
                continue
            parts.append(label_replica(text, replica))
        return PlainTextResponse("".join(parts), media_type="text/plain; version=0.0.4")


def build_app(
    model_path: Optional[str] = None,
    *,
    n_threads: int = 1,
    num_replicas: Optional[int] = 1,
    autoscaling_config: Optional[Dict[str, Any]] = None,
    max_ongoing_requests: int = 16,
    api_key: Optional[str] = None,
    llama_kwargs: Optional[Dict[str, Any]] = None,
    name: str = "spindle",
):
    """The Serve application: ``Ingress`` in front of ``SpindleServer``.

    ``n_threads`` is each replica's compute threads and its ``num_cpus``.
    ``autoscaling_config`` (Ray's, e.g. ``{"min_replicas": 1,
    "max_replicas": 4, "target_ongoing_requests": 8}``) replaces
    ``num_replicas``. ``max_ongoing_requests`` should be at least the
    engine's ``max_seqs`` (8 by default) so the batch can fill.
    ``llama_kwargs`` go to each replica's ``spindle.Llama``.
    """
    scaling: Dict[str, Any] = (
        {"autoscaling_config": autoscaling_config} if autoscaling_config else {"num_replicas": num_replicas}
    )
    server = serve.deployment(
        SpindleServer,
        name=f"{name}-server",
        ray_actor_options={"num_cpus": n_threads},
        max_ongoing_requests=max_ongoing_requests,
        # By import path, so the ingress's process shares the class (and
        # its `live` table) with the router it builds.
        request_router_config=RequestRouterConfig(request_router_class="spindle.ray_serve.PrefixAffinityRouter"),
        # A lost node's replicas are noticed by the controller's health checks.
        health_check_period_s=2,
        health_check_timeout_s=10,
        **scaling,
    ).bind(model_path, n_threads, dict(llama_kwargs or {}))
    ingress = serve.deployment(Ingress, name=f"{name}-ingress", ray_actor_options={"num_cpus": 0})
    return ingress.bind(server, api_key)


__all__ = ["build_app", "conversation_key", "label_replica", "Ingress", "SpindleServer", "PrefixAffinityRouter", "SpindleError"]
