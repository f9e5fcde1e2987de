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
(HTTP 503, or an ``error`` event with code 503 then the end of a stream);
nothing waits without bound (``request_timeout_s`` for a whole answer,
``stream_idle_s`` between two events of a stream, ``control_timeout_s``
for ``/metrics`` and ``/replicas``). The client retries it: ``openai``'s
client retries a 503 answer itself, and :func:`spindle.client.resumable_stream`
re-sends a stream that broke midway with the same seed and passes on only
what the client has not seen (Spindle's sampling is a function of the seed
and the position, so the retry's tokens are the lost ones).
"""

import asyncio
import hashlib
import importlib
import json
import re
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

import ray
import ray.util
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle
from ray.serve.exceptions import RayServeException
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

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
    A call with ``target=<replica id>`` goes to that replica (to any
    replica when it is gone: the answer names its replica, and the caller
    checks; an empty choice would make Serve wait for it forever)."""

    def update_replicas(self, replicas: List[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = _live_replicas()
        live.clear()
        live.update({r.replica_id.unique_id: r.node_id for r in replicas})

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        _live_replicas().pop(replica_id.unique_id, None)

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
            chosen = [r for r in candidate_replicas if r.replica_id.unique_id == target]
            return [chosen or candidate_replicas]
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
        # The address the node joined with (what `ray start
        # --node-ip-address` gave), not the one a route lookup finds.
        self.node_ip = next(
            (n["NodeManagerAddress"] for n in ray.nodes() if n.get("NodeID") == self.node),
            None,
        ) or ray.util.get_node_ip_address()

    async def call(self, method: str, path: str, body: Optional[Dict[str, Any]]) -> Tuple[int, str, str, str]:
        """``(status, JSON text, replica, node address)`` of one request."""
        text = None if body is None else json.dumps(body)
        status, answer = await asyncio.to_thread(self.llm._engine.request, method, path, text)
        return status, answer, self.replica, self.node_ip

    async def stream(self, path: str, body: Dict[str, Any]) -> AsyncIterator[Any]:
        """First ``(status, error text or None, replica, node address)``, then
        each event's data. Cancelling the generator cancels the request."""
        status, text, events = await asyncio.to_thread(self.llm._engine.stream, path, json.dumps(body))
        if events is None:
            yield (status, text, self.replica, self.node_ip)
            return
        yield (status, None, self.replica, self.node_ip)
        try:
            while True:
                data = await asyncio.to_thread(next, events, None)
                if data is None:
                    return
                yield data
        finally:
            events.close()

    def metrics(self, target: Optional[str] = None) -> Tuple[str, str, str]:
        """``(replica, node address, Prometheus text)``."""
        return self.replica, self.node_ip, self.llm.metrics()


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


def _lost(e: BaseException) -> Optional[str]:
    """Why a call failed, in words, when the failure is the cluster's (the
    replica or its node went away, Serve could not place the call, it timed
    out): the client may retry those. None for an error of the request."""
    if isinstance(e, asyncio.TimeoutError):
        return "no answer in time"
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None)
        if isinstance(cause, (ray.exceptions.RayError, RayServeException)):
            return _lost(cause)
        return None
    if isinstance(e, (ray.exceptions.RayError, RayServeException)):
        return type(e).__name__
    return None


def _failure(e: BaseException, what: str) -> JSONResponse:
    """A clean answer for a call that raised: 503 (retry) for a lost
    replica or node, 504 for a timeout, 500 otherwise."""
    why = _lost(e)
    if why is None:
        return JSONResponse(_error(500, f"the replica failed: {type(e).__name__}: {e}"), 500)
    status = 504 if isinstance(e, asyncio.TimeoutError) else 503
    return JSONResponse(_error(status, f"the replica serving this {what} was lost ({why}); retry it"), status)


app = FastAPI(title="Spindle on Ray Serve")


@serve.ingress(app)
class Ingress:
    """The OpenAI-compatible front (deployed by :func:`build_app`).

    ``request_timeout_s`` bounds a whole non-streaming answer and the wait
    for a stream's first event, ``stream_idle_s`` the wait between two
    events of a stream, ``control_timeout_s`` each replica's part of
    ``/metrics`` and ``/replicas``.
    """

    def __init__(
        self,
        server: DeploymentHandle,
        api_key: Optional[str] = None,
        request_timeout_s: float = 600.0,
        stream_idle_s: float = 60.0,
        control_timeout_s: float = 10.0,
    ):
        self.server = server
        self.api_key = api_key
        self.request_timeout_s = request_timeout_s
        self.stream_idle_s = stream_idle_s
        self.control_timeout_s = control_timeout_s

    def _refused(self, request: Request) -> Optional[JSONResponse]:
        if self.api_key is None:
            return None
        if request.headers.get("authorization", "") != f"Bearer {self.api_key}":
            return JSONResponse(_error(401, "missing or wrong API key: send Authorization: Bearer KEY", "authentication_error"), 401)
        return None

    async def _bounded(self, response: Any, timeout_s: float) -> Any:
        """The value of a deployment response, cancelled after ``timeout_s``."""
        try:
            return await asyncio.wait_for(response, timeout_s)
        except asyncio.TimeoutError:
            response.cancel()
            raise

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
            status, text, replica, node = await self._bounded(
                self.server.call.remote("POST", path, body), self.request_timeout_s
            )
        except Exception as e:  # noqa: BLE001 - every failure becomes an answer
            return _failure(e, "request")
        return PlainTextResponse(
            text, status, media_type="application/json", headers={"x-spindle-replica": replica, "x-spindle-node": node}
        )

    async def _stream(self, path: str, body: Dict[str, Any]):
        gen = self.server.options(stream=True).stream.remote(path, body)
        try:
            status, error, replica, node = await asyncio.wait_for(gen.__anext__(), self.request_timeout_s)
        except StopAsyncIteration:
            gen.cancel()
            return JSONResponse(_error(503, "the replica ended the stream before it began; retry it"), 503)
        except Exception as e:  # noqa: BLE001
            gen.cancel()
            return _failure(e, "request")
        headers = {"x-spindle-replica": replica, "x-spindle-node": node}
        if error is not None:
            gen.cancel()
            return PlainTextResponse(error, status, media_type="application/json", headers=headers)
        idle_s = self.stream_idle_s

        async def events() -> AsyncIterator[bytes]:
            try:
                while True:
                    try:
                        data = await asyncio.wait_for(gen.__anext__(), idle_s)
                    except StopAsyncIteration:
                        break
                    yield f"data: {data}\n\n".encode()
                yield b"data: [DONE]\n\n"
            except Exception as e:  # noqa: BLE001 - the stream ends with an error event
                why = _lost(e)
                if why is None:
                    err = _error(500, f"the replica failed: {type(e).__name__}: {e}")
                else:
                    err = _error(503, f"the replica serving this stream was lost ({why}); retry the request")
                yield f"data: {json.dumps(err)}\n\n".encode()
            finally:
                gen.cancel()

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

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
        try:
            status, text, _, _ = await self._bounded(
                self.server.call.remote("GET", "/v1/models", None), self.control_timeout_s
            )
        except Exception as e:  # noqa: BLE001
            return _failure(e, "request")
        return PlainTextResponse(text, status, media_type="application/json")

    @app.get("/health")
    async def health(self):
        return {"status": "ok", "replicas": len(_live_replicas())}

    async def _each_replica(self) -> List[Tuple[str, str, str]]:
        """``(replica, node address, metrics text)`` of every live replica
        that answers within ``control_timeout_s``."""
        # One call at a time: calls made inside one request share its
        # internal request id, and Serve's router, matching a chosen replica
        # to its pending call by that id, leaves all but one of several
        # concurrent ones waiting (Ray 2.60).
        seen: Dict[str, Tuple[str, str, str]] = {}
        if not _live_replicas():
            # The router starts with the handle's first call and learns the
            # replicas soon after: this call starts it.
            try:
                answer = await self._bounded(self.server.metrics.remote(), self.control_timeout_s)
                seen[answer[0]] = answer
            except Exception:  # noqa: BLE001
                pass
            for _ in range(20):
                if _live_replicas():
                    break
                await asyncio.sleep(0.1)
        for r in sorted(_live_replicas()):
            try:
                answer = await self._bounded(self.server.metrics.remote(target=r), self.control_timeout_s)
            except Exception:  # noqa: BLE001 - a replica that does not answer is left out
                continue
            seen.setdefault(answer[0], answer)
        return [seen[r] for r in sorted(seen)]

    @app.get("/replicas")
    async def replicas(self):
        """The replicas the router knows and that answer: id, node address."""
        live = _live_replicas()
        return {
            "replicas": [
                {"id": r, "node_id": live.get(r), "node_ip": node} for r, node, _ in await self._each_replica()
            ]
        }

    @app.get("/replicas/{replica}/metrics")
    async def replica_metrics(self, replica: str):
        if replica not in _live_replicas():
            return JSONResponse(_error(404, f"no replica {replica}: GET /replicas lists them", "invalid_request_error"), 404)
        try:
            got, _, text = await self._bounded(self.server.metrics.remote(target=replica), self.control_timeout_s)
        except Exception as e:  # noqa: BLE001
            return _failure(e, "request")
        if got != replica:
            return JSONResponse(_error(503, f"replica {replica} is gone; GET /replicas lists the live ones"), 503)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/metrics")
    async def metrics(self):
        parts = [label_replica(text, replica) for replica, _, text in await self._each_replica()]
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
    ingress_actor_options: Optional[Dict[str, Any]] = None,
    request_timeout_s: float = 600.0,
    stream_idle_s: float = 60.0,
):
    """The Serve application: ``Ingress`` in front of ``SpindleServer``.

    ``n_threads`` is each replica's compute threads and its ``num_cpus``.
    ``autoscaling_config`` (Ray's, e.g. ``{"min_replicas": 1,
    "max_replicas": 4, "target_ongoing_requests": 8}``) replaces
    ``num_replicas``. ``max_ongoing_requests`` should be at least the
    engine's ``max_seqs`` (8 by default) so the batch can fill.
    ``llama_kwargs`` go to each replica's ``spindle.Llama``.
    ``ingress_actor_options``: Ray actor options of the ingress (default
    ``{"num_cpus": 0}``; add ``"resources": {"node:__internal_head__":
    0.001}`` to keep it on the head node). ``request_timeout_s`` and
    ``stream_idle_s``: see :class:`Ingress`.
    """
    if n_threads < 1:
        raise ValueError(f"n_threads={n_threads}: each replica needs at least one thread")
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
    ingress = serve.deployment(
        Ingress, name=f"{name}-ingress", ray_actor_options=dict(ingress_actor_options or {"num_cpus": 0})
    )
    return ingress.bind(server, api_key, request_timeout_s, stream_idle_s)


__all__ = ["build_app", "conversation_key", "label_replica", "Ingress", "SpindleServer", "PrefixAffinityRouter", "SpindleError"]
