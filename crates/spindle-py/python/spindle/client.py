"""A stream that survives the loss of the replica serving it.

``openai``'s client retries a request that fails before its answer begins
(a 503, a refused connection). A stream that breaks midway, because the
replica or the node serving it went away, ends with an error instead:
:func:`resumable_stream` sends the request again and passes on only the
text the caller has not seen yet, so the caller sees one stream.

    from openai import OpenAI
    from spindle.client import resumable_stream

    client = OpenAI(base_url="http://HEAD:8000/v1", api_key="none", timeout=60)
    stream = resumable_stream(client.chat.completions.create, model="m",
                              messages=[{"role": "user", "content": "Hi"}], max_tokens=64)
    for chunk in stream:
        ...
    print(stream.attempts, stream.errors)

This works because a retry produces the same tokens: Spindle's sampling is
a function of the seed, the position and the logits, and every replica of
one model computes the same logits, so the wrapper gives every request a
seed (unless it has one) and the retry's text starts with what was already
delivered. The wrapper checks that it does, and raises
:class:`StreamDiverged` where it does not (another model behind the same
name, say). Everything is bounded: at most ``max_attempts`` sends, none
started after ``deadline_s``; each send's own waits are the client's
``timeout``.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

# Errors of a send that a retry can cure: the cluster's, not the request's.
_RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504}


class StreamDiverged(RuntimeError):
    """A retried stream did not repeat the text already delivered."""


def _retryable(e: BaseException) -> bool:
    import openai

    if isinstance(e, openai.APIStatusError):
        return e.status_code in _RETRY_STATUSES
    if isinstance(e, openai.APIConnectionError):  # timeouts included
        return True
    if isinstance(e, openai.APIError):
        # An error event inside a stream: the ingress says 503 for a lost replica.
        body = e.body if isinstance(e.body, dict) else {}
        return body.get("code") in _RETRY_STATUSES or body.get("type") == "server_error"
    return False


def _piece(chunk: Any) -> Optional[str]:
    """The text a chunk adds (chat delta content or completion text)."""
    if not getattr(chunk, "choices", None):
        return None
    choice = chunk.choices[0]
    delta = getattr(choice, "delta", None)
    if delta is not None:
        return getattr(delta, "content", None)
    return getattr(choice, "text", None)


def _with_piece(chunk: Any, text: str) -> Any:
    chunk = chunk.model_copy(deep=True)
    choice = chunk.choices[0]
    if getattr(choice, "delta", None) is not None:
        choice.delta.content = text
    else:
        choice.text = text
    return chunk


class resumable_stream:  # noqa: N801 - used like a function
    """Iterates the chunks of ``create(stream=True, **kwargs)`` (an
    ``openai`` client's ``chat.completions.create`` or
    ``completions.create``), re-sending the request when the stream breaks
    with an error a retry can cure.

    ``attempts``: sends made; ``errors``: what ended each failed send;
    ``headers``: the response headers of each send that got an answer
    (Spindle's ingress names the replica in ``x-spindle-replica``).
    """

    def __init__(
        self,
        create: Callable[..., Any],
        *,
        max_attempts: int = 3,
        deadline_s: float = 300.0,
        backoff_s: float = 0.5,
        **kwargs: Any,
    ):
        if max_attempts < 1:
            raise ValueError(f"max_attempts={max_attempts}: at least one send is needed")
        kwargs.pop("stream", None)
        if kwargs.get("seed") is None:
            kwargs["seed"] = random.getrandbits(31)
        if kwargs.get("n", 1) != 1:
            raise ValueError("resumable_stream follows one choice (n=1)")
        self._create = create
        self._kwargs = kwargs
        self._max_attempts = max_attempts
        self._deadline = time.monotonic() + deadline_s
        self._backoff_s = backoff_s
        self.attempts = 0
        self.errors: List[BaseException] = []
        self.headers: List[Dict[str, str]] = []
        self._chunks = self._run()

    def __iter__(self) -> "resumable_stream":
        return self

    def __next__(self) -> Any:
        return next(self._chunks)

    def close(self) -> None:
        self._chunks.close()

    def _run(self) -> Iterator[Any]:
        delivered = ""  # text the caller has had
        opened = False  # whether the caller has had a chunk
        while True:
            self.attempts += 1
            seen = 0  # characters of this send's text so far
            stream = None
            finished = False
            try:
                stream = self._create(stream=True, **self._kwargs)
                response = getattr(stream, "response", None)
                if response is not None:
                    self.headers.append(dict(response.headers))
                for chunk in stream:
                    piece = _piece(chunk) or ""
                    done = bool(chunk.choices) and chunk.choices[0].finish_reason is not None
                    start, seen = seen, seen + len(piece)
                    if start < len(delivered):
                        # Text the caller already has: this send must repeat it.
                        overlap = delivered[start : min(seen, len(delivered))]
                        if piece[: len(overlap)] != overlap:
                            raise StreamDiverged(
                                f"the retried stream differs at character {start}: "
                                f"{piece[: len(overlap)]!r} where {overlap!r} was delivered"
                            )
                        piece = piece[len(overlap) :]
                        if not piece and not done:
                            continue
                        chunk = _with_piece(chunk, piece)
                    elif not piece and not done and opened and start == 0:
                        continue  # a retry's opening chunk (the role): the caller has it
                    delivered += piece
                    opened = True
                    finished = finished or done
                    yield chunk
                if not finished:
                    raise ConnectionError("the stream ended without a finish_reason")
                return
            except StreamDiverged:
                raise
            except Exception as e:  # noqa: BLE001 - sorted by _retryable below
                if finished:
                    return  # broke after its last chunk: nothing was lost
                self.errors.append(e)
                retry = isinstance(e, ConnectionError) or _retryable(e)
                if not retry or self.attempts >= self._max_attempts:
                    raise
                pause = self._backoff_s * (2 ** (self.attempts - 1))
                if time.monotonic() + pause >= self._deadline:
                    raise
                time.sleep(pause)
            finally:
                if stream is not None and hasattr(stream, "close"):
                    stream.close()


__all__ = ["resumable_stream", "StreamDiverged"]
