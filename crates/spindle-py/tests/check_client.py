"""Checks of spindle.client.resumable_stream against streams whose whole
text is known (run by crates/spindle-cli/tests/python_package.rs; needs the
openai package, nothing else: the streams are made here, as the openai
client parses them).

A stream that breaks after some chunks is sent again; what the caller sees
must be the whole text exactly once; a retry that differs raises; errors of
the request are not retried; the number of sends is bounded.
"""

import time

import openai

try:  # the openai client's HTTP library: httpx2 in its newer releases
    import httpx2 as httpx
except ImportError:
    import httpx
from openai.types.chat import ChatCompletionChunk
from openai.types.completion import Completion
from openai.types.completion_choice import CompletionChoice

from spindle.client import StreamDiverged, resumable_stream

TEXT = "The quick brown fox jumps over the lazy dog, twice."
REQUEST = httpx.Request("POST", "http://replica.invalid/v1/chat/completions")


def chat_chunks(text, pieces):
    """The chunks of a chat stream of `text` cut into `pieces` pieces: a
    role-only chunk, the content, a closing chunk with finish_reason."""
    size = -(-len(text) // pieces)
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    out = [ChatCompletionChunk(**base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
    for i in range(0, len(text), size):
        out.append(ChatCompletionChunk(**base, choices=[{"index": 0, "delta": {"content": text[i : i + size]}, "finish_reason": None}]))
    out.append(ChatCompletionChunk(**base, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}]))
    return out


def completion_chunks(text, pieces):
    size = -(-len(text) // pieces)
    base = {"id": "c", "object": "text_completion", "created": 0, "model": "m"}
    # Built without validation, as the client builds streamed chunks (a
    # chunk's finish_reason is None until the last, which the type forbids).
    def chunk(piece, finish):
        return Completion.model_construct(**base, choices=[CompletionChoice.model_construct(index=0, text=piece, finish_reason=finish, logprobs=None)])

    out = [chunk(text[i : i + size], None) for i in range(0, len(text), size)]
    out.append(chunk("", "stop"))
    return out


class Sends:
    """A fake `create`: each send streams the chunks of its plan, then
    raises the plan's error (or ends) where the plan says."""

    def __init__(self, plans):
        self.plans = list(plans)
        self.calls = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        chunks, break_after, error = self.plans.pop(0)
        if break_after == 0 and error is not None:
            raise error

        def gen():
            for i, c in enumerate(chunks):
                if break_after is not None and i == break_after:
                    if error is not None:
                        raise error
                    return  # the connection closed without an error
                yield c

        return gen()


def lost():
    """What the ingress's error event becomes in the openai client."""
    return openai.APIError("the replica serving this stream was lost (ActorDiedError); retry the request", REQUEST, body={"code": 503, "type": "server_error"})


def text_of(chunks):
    out = []
    for c in chunks:
        ch = c.choices[0]
        out.append((ch.delta.content if hasattr(ch, "delta") else ch.text) or "")
    return "".join(out)


def check_resumes():
    # Cut in 7 pieces, broken after 3 chunks; the retry is cut in 5 pieces,
    # so its chunks straddle what was delivered.
    sends = Sends([(chat_chunks(TEXT, 7), 3, lost()), (chat_chunks(TEXT, 5), None, None)])
    stream = resumable_stream(sends, model="m", messages=[], backoff_s=0.01)
    got = list(stream)
    assert text_of(got) == TEXT, text_of(got)
    assert stream.attempts == 2 and len(stream.errors) == 1, (stream.attempts, stream.errors)
    roles = [c for c in got if c.choices[0].delta.role == "assistant"]
    assert len(roles) == 1, "the role chunk was passed on twice"
    finals = [c for c in got if c.choices[0].finish_reason is not None]
    assert len(finals) == 1 and got[-1].choices[0].finish_reason == "length"
    seeds = {c["seed"] for c in sends.calls}
    assert len(seeds) == 1 and isinstance(seeds.pop(), int), "every send carries the same seed"
    assert all(c["stream"] is True for c in sends.calls)
    print("resumes: the whole text once, one role chunk, one finish, one seed")


def check_completion_and_silent_close():
    # A completion stream that closes without an error and without a
    # finish_reason is broken too, as is a connection reset (the openai
    # client raises APIConnectionError for it); the given seed is kept.
    sends = Sends([(completion_chunks(TEXT, 6), 2, None), (completion_chunks(TEXT, 4), 1, openai.APIConnectionError(request=REQUEST)), (completion_chunks(TEXT, 3), None, None)])
    stream = resumable_stream(sends, model="m", prompt="x", seed=42, backoff_s=0.01)
    got = list(stream)
    assert text_of(got) == TEXT, text_of(got)
    assert stream.attempts == 3, stream.attempts
    assert [c["seed"] for c in sends.calls] == [42, 42, 42]
    print("completions: resumed after a silent close and a connection error")


def check_diverged():
    sends = Sends([(chat_chunks(TEXT, 7), 4, lost()), (chat_chunks(TEXT.upper(), 7), None, None)])
    stream = resumable_stream(sends, model="m", messages=[], backoff_s=0.01)
    try:
        list(stream)
    except StreamDiverged as e:
        assert "differs at character" in str(e), e
    else:
        raise AssertionError("a retry with other text was accepted")
    print("diverged: a retry with other text raises StreamDiverged")


def check_not_retried():
    bad = openai.BadRequestError("temperature must be between 0 and 2", response=httpx.Response(400, request=REQUEST), body=None)
    sends = Sends([([], 0, bad)])
    stream = resumable_stream(sends, model="m", messages=[], backoff_s=0.01)
    try:
        list(stream)
    except openai.BadRequestError:
        pass
    else:
        raise AssertionError("a 400 did not raise")
    assert stream.attempts == 1, "a 400 was retried"
    print("errors of the request: raised at once, not retried")


def check_bounded():
    sends = Sends([(chat_chunks(TEXT, 7), 2, lost()) for _ in range(5)])
    stream = resumable_stream(sends, model="m", messages=[], max_attempts=3, backoff_s=0.01)
    start = time.monotonic()
    try:
        list(stream)
    except openai.APIError:
        pass
    else:
        raise AssertionError("a stream that always breaks finished")
    assert stream.attempts == 3 and len(sends.calls) == 3, stream.attempts
    assert time.monotonic() - start < 1.0
    # The deadline stops retries whose pause would pass it.
    sends = Sends([(chat_chunks(TEXT, 7), 2, lost()) for _ in range(5)])
    stream = resumable_stream(sends, model="m", messages=[], max_attempts=5, deadline_s=0.5, backoff_s=0.4)
    try:
        list(stream)
    except openai.APIError:
        pass
    assert stream.attempts == 2, stream.attempts
    try:
        resumable_stream(sends, model="m", messages=[], max_attempts=0)
    except ValueError as e:
        assert "max_attempts" in str(e)
    else:
        raise AssertionError("max_attempts=0 was accepted")
    print("bounded: at most max_attempts sends, none past the deadline")


check_resumes()
check_completion_and_silent_close()
check_diverged()
check_not_retried()
check_bounded()
print("all client checks passed")
