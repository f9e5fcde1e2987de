"""``Llama``: llama-cpp-python's API over Spindle's engine.

Each method turns its arguments into the body of the matching request of
``spindle serve`` (``/v1/completions``, ``/v1/chat/completions``,
``/v1/decide``, ``/v1/embeddings``, ``/tokenize``) and hands it to the
engine in this process, which answers exactly as the server would. Defaults
are llama-cpp-python's (``max_tokens=16`` and ``temperature=0.8`` for
completions, ``temperature=0.2`` for chat), so code written for it gives
comparable results.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from ._native import Engine

# Constructor arguments of llama-cpp-python that steer GPUs, memory mapping
# or llama.cpp internals: accepted (so its code runs unchanged) and ignored.
_IGNORED_ARGS = frozenset(
    {
        "n_gpu_layers",
        "split_mode",
        "main_gpu",
        "tensor_split",
        "rpc_servers",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "kv_overrides",
        "n_ubatch",
        "n_threads_batch",
        "rope_scaling_type",
        "pooling_type",
        "rope_freq_base",
        "rope_freq_scale",
        "yarn_ext_factor",
        "yarn_attn_factor",
        "yarn_beta_fast",
        "yarn_beta_slow",
        "yarn_orig_ctx",
        "logits_all",
        "offload_kqv",
        "flash_attn",
        "op_offload",
        "swa_full",
        "no_perf",
        "last_n_tokens_size",
        "numa",
        "lora_base",
        "lora_scale",
        "lora_path",
        "chat_handler",
        "draft_model",
        "tokenizer",
        "type_k",
        "type_v",
        "spm_infill",
    }
)


class SpindleError(ValueError):
    """A request the engine refused or could not finish.

    ``status`` is the HTTP status ``spindle serve`` answers for it (400 for
    a bad argument, 429 when the queue is full, ...), ``message`` the
    server's message, ``param`` the argument at fault when there is one.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        kind: Optional[str] = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind

    @classmethod
    def from_body(cls, status: int, body: str) -> "SpindleError":
        try:
            err = json.loads(body).get("error", {})
        except (ValueError, AttributeError):
            err = {}
        if not isinstance(err, dict):
            err = {"message": str(err)}
        return cls(status, err.get("message") or body or f"status {status}", err.get("param"), err.get("type"))


@contextlib.contextmanager
def _stderr_silenced(silence: bool):
    """Sends file descriptor 2 to /dev/null for a while (the engine writes
    its start-up lines there, as llama.cpp does with ``verbose=True``)."""
    if not silence:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _response_format(fmt: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """llama-cpp-python's ``{"type": "json_object", "schema": S}`` is
    OpenAI's ``json_schema`` format; OpenAI's own forms pass through."""
    if fmt is None:
        return None
    if fmt.get("type") == "json_object" and fmt.get("schema") is not None:
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt["schema"]}}
    return fmt


def _grammar_text(grammar: Any) -> Optional[str]:
    if grammar is None or isinstance(grammar, str):
        return grammar
    raise TypeError(
        "grammar: Spindle takes a Lark grammar as a string (llama.cpp's GBNF objects are not read); "
        "for JSON, pass response_format={'type': 'json_object', 'schema': ...} instead"
    )


class Llama:
    """A model loaded once and served in this process.

    ``model_path``: a GGUF file or Hugging Face directory (default: Gemma 3
    270M Q4_K_M, fetched on first use). ``n_ctx``: tokens per sequence
    (default: 4096, or the model's when shorter; 0 means the same).
    ``n_threads``: compute threads (default: the physical cores; rayon and
    Spindle's pool do not read ``OMP_NUM_THREADS``). ``n_batch``: rows per
    forward pass. ``max_seqs``: sequences decoded together (Python threads
    sharing this object share the batch). ``spec``: speculative decoding,
    as ``spindle serve --spec`` (``auto``, ``ngram``, ``suffix``,
    ``draft:PATH``, ``self``, ``off``); the output is the same in every
    mode. ``embedding_model``: an encoder for ``embed`` (a path, or
    ``"default"`` for all-MiniLM-L6-v2; ``embedding=True`` picks the
    default). ``extra_args``: any other ``spindle serve`` flags.
    """

    def __init__(
        self,
        model_path: Optional[str] = None,
        *,
        n_ctx: Optional[int] = None,
        n_batch: int = 512,
        n_threads: Optional[int] = None,
        seed: Optional[int] = None,
        spec: str = "auto",
        max_seqs: int = 8,
        kv_type: Optional[str] = None,
        embedding: bool = False,
        embedding_model: Optional[str] = None,
        chat_format: Optional[str] = None,
        verbose: bool = True,
        extra_args: Sequence[str] = (),
        **kwargs: Any,
    ):
        unknown = sorted(set(kwargs) - _IGNORED_ARGS)
        if unknown:
            raise TypeError(f"Llama() got unexpected keyword arguments: {', '.join(unknown)}")
        for name, value, least in (("n_ctx", n_ctx, 0), ("n_batch", n_batch, 1), ("n_threads", n_threads, 1), ("max_seqs", max_seqs, 1)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r}: must be an integer of at least {least}")
        if chat_format is not None:
            raise ValueError(
                f"chat_format={chat_format!r}: Spindle renders the chat template the model file carries; "
                "leave chat_format unset"
            )
        self._init_args: Dict[str, Any] = dict(
            model_path=model_path,
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=n_threads,
            seed=seed,
            spec=spec,
            max_seqs=max_seqs,
            kv_type=kv_type,
            embedding=embedding,
            embedding_model=embedding_model,
            verbose=verbose,
            extra_args=tuple(extra_args),
        )
        argv: List[str] = []
        if model_path is not None:
            argv += ["-m", os.fspath(model_path)]
        if n_ctx:
            argv += ["--ctx", str(int(n_ctx))]
        if n_threads is not None:
            argv += ["-t", str(int(n_threads))]
        argv += ["--max-batch-tokens", str(int(n_batch)), "--max-seqs", str(int(max_seqs))]
        argv += ["--spec", spec]
        if kv_type is not None:
            argv += ["--kv-type", kv_type]
        if embedding_model is None and embedding:
            embedding_model = "default"
        if embedding_model is not None:
            argv += ["--embedding-model", os.fspath(embedding_model)]
        argv += [str(a) for a in extra_args]
        self.verbose = verbose
        self.model_path = model_path
        with _stderr_silenced(not verbose):
            self._engine = Engine(argv)
        if verbose:
            print(f"spindle: {self._engine.name} ({self._engine.summary})", file=sys.stderr)
        # Requests without a seed draw one from here when the object was
        # given a seed, so a script's outputs repeat from run to run.
        self._seeds = random.Random(seed) if seed is not None and seed >= 0 and seed != 0xFFFFFFFF else None
        self._seeds_lock = threading.Lock()
        self._props: Optional[Dict[str, Any]] = None

    # -- pickling: Ray ships a Llama by its constructor arguments -----------

    def __getstate__(self) -> Dict[str, Any]:
        return dict(self._init_args)

    def __setstate__(self, state: Dict[str, Any]) -> None:
        args = dict(state)
        self.__init__(args.pop("model_path"), **args)

    def __repr__(self) -> str:
        return f"spindle.Llama({self._engine.name!r}: {self._engine.summary})"

    # -- the transport -------------------------------------------------------

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        status, text = self._engine.request(method, path, None if body is None else json.dumps(body))
        if status >= 400:
            raise SpindleError.from_body(status, text)
        try:
            return json.loads(text)
        except ValueError:
            return text

    def _stream(self, path: str, body: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        status, text, events = self._engine.stream(path, json.dumps(body))
        if events is None:
            raise SpindleError.from_body(status, text)
        return self._chunks(events)

    @staticmethod
    def _chunks(events: Any) -> Iterator[Dict[str, Any]]:
        # A generator: dropping it (or breaking out of its loop) closes the
        # events, which cancels the request and frees its sequence.
        try:
            for data in events:
                chunk = json.loads(data)
                if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                    err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                    raise SpindleError(500, err.get("message", data), err.get("param"), err.get("type"))
                yield chunk
        finally:
            events.close()

    def _seed(self, seed: Optional[int]) -> Optional[int]:
        if seed is not None or self._seeds is None:
            return seed
        with self._seeds_lock:
            return self._seeds.getrandbits(31)

    def _sampling(
        self,
        *,
        max_tokens: Optional[int],
        temperature: float,
        top_p: float,
        min_p: float,
        top_k: int,
        stop: Union[str, List[str], None],
        seed: Optional[int],
        frequency_penalty: float,
        presence_penalty: float,
        repeat_penalty: float,
        logit_bias: Optional[Dict[Any, float]],
        grammar: Any,
        stream: bool,
        extra: Dict[str, Any],
    ) -> Dict[str, Any]:
        body: Dict[str, Any] = {
            "model": self._engine.name,
            "temperature": temperature,
            "top_p": top_p,
            "min_p": min_p,
            "top_k": top_k,
            "frequency_penalty": frequency_penalty,
            "presence_penalty": presence_penalty,
        }
        if max_tokens is not None and max_tokens > 0:
            body["max_tokens"] = max_tokens
        if stop:
            body["stop"] = stop
        seed = self._seed(seed)
        if seed is not None:
            body["seed"] = seed
        if repeat_penalty != 1.0:
            body["repetition_penalty"] = repeat_penalty
        if logit_bias:
            body["logit_bias"] = {str(k): v for k, v in logit_bias.items()}
        grammar = _grammar_text(grammar)
        if grammar is not None:
            body["grammar"] = grammar
        if stream:
            body["stream"] = True
        body.update(extra)
        return body

    # -- completions -----------------------------------------------------------

    def create_completion(
        self,
        prompt: Union[str, List[int]],
        suffix: Optional[str] = None,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: Optional[int] = None,
        echo: bool = False,
        stop: Union[str, List[str], None] = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: Optional[int] = None,
        model: Optional[str] = None,
        logit_bias: Optional[Dict[Any, float]] = None,
        grammar: Any = None,
        **extra: Any,
    ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """Text after ``prompt`` (a string or token ids), as ``/v1/completions``
        answers it. ``extra`` takes the server's other fields
        (``json_schema``, ``regex``, ``response_format``, ``user``, ...)."""
        _check_unsupported(typical_p=(typical_p, 1.0), **_llama_only(extra))
        body = self._sampling(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            min_p=min_p,
            top_k=top_k,
            stop=stop,
            seed=seed,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            repeat_penalty=repeat_penalty,
            logit_bias=logit_bias,
            grammar=grammar,
            stream=stream,
            extra=extra,
        )
        body["prompt"] = prompt
        if suffix is not None:
            body["suffix"] = suffix
        if logprobs is not None:
            body["logprobs"] = logprobs
        if echo:
            body["echo"] = True
        if stream:
            return self._stream("/v1/completions", body)
        return self._call("POST", "/v1/completions", body)

    def __call__(self, prompt: Union[str, List[int]], *args: Any, **kwargs: Any) -> Any:
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(
        self,
        messages: List[Dict[str, Any]],
        functions: Optional[List[Dict[str, Any]]] = None,
        function_call: Any = None,
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Any = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: Union[str, List[str], None] = None,
        seed: Optional[int] = None,
        response_format: Optional[Dict[str, Any]] = None,
        max_tokens: Optional[int] = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        model: Optional[str] = None,
        logit_bias: Optional[Dict[Any, float]] = None,
        logprobs: Optional[bool] = None,
        top_logprobs: Optional[int] = None,
        grammar: Any = None,
        **extra: Any,
    ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """The assistant's reply to ``messages`` through the model's chat
        template, as ``/v1/chat/completions`` answers it: tool calls
        (``tools``, ``tool_choice``), structured output
        (``response_format``), log-probabilities, streaming."""
        _check_unsupported(typical_p=(typical_p, 1.0), **_llama_only(extra))
        body = self._sampling(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            min_p=min_p,
            top_k=top_k,
            stop=stop,
            seed=seed,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            repeat_penalty=repeat_penalty,
            logit_bias=logit_bias,
            grammar=grammar,
            stream=stream,
            extra=extra,
        )
        body["messages"] = messages
        for key, value in (
            ("functions", functions),
            ("function_call", function_call),
            ("tools", tools),
            ("tool_choice", tool_choice),
            ("response_format", _response_format(response_format)),
            ("logprobs", logprobs),
            ("top_logprobs", top_logprobs),
        ):
            if value is not None:
                body[key] = value
        if stream:
            return self._stream("/v1/chat/completions", body)
        return self._call("POST", "/v1/chat/completions", body)

    # -- decisions, embeddings, tokens --------------------------------------

    def decide(self, state: Any, questions: List[Dict[str, Any]], **options: Any) -> Dict[str, Any]:
        """The probability of every option of typed ``questions`` about
        ``state`` from one pass, as ``/v1/decide`` answers (``options``:
        its other fields, such as ``calibration`` or ``debias``)."""
        body = {"model": self._engine.name, "state": state, "questions": questions}
        body.update(options)
        return self._call("POST", "/v1/decide", body)

    def _embedding_model(self) -> str:
        models = self._call("GET", "/v1/models")["data"]
        for m in models:
            if "embedding_dimensions" in m:
                return m["id"]
        raise SpindleError(
            400,
            "this Llama has no embedding model: construct it with embedding_model='default' "
            "(all-MiniLM-L6-v2) or a path to a BERT GGUF or Hugging Face directory",
            "embedding_model",
        )

    def create_embedding(
        self, input: Union[str, List[str], List[int], List[List[int]]], model: Optional[str] = None, **extra: Any
    ) -> Dict[str, Any]:
        """``/v1/embeddings``: one vector per input, OpenAI's response."""
        body = {"model": model or self._embedding_model(), "input": input}
        body.update(extra)
        return self._call("POST", "/v1/embeddings", body)

    def embed(
        self, input: Union[str, List[str]], normalize: bool = True, truncate: bool = True
    ) -> Union[List[float], List[List[float]]]:
        """The vector of a text, or one per text of a list (normalised as
        the embedding model's own configuration says)."""
        if not normalize:
            raise ValueError(
                "normalize=False: Spindle returns the vectors the embedding model's configuration defines "
                "(sentence-transformers' normalisation for all-MiniLM-L6-v2)"
            )
        out = self.create_embedding(input, truncate=truncate)
        vectors = [d["embedding"] for d in sorted(out["data"], key=lambda d: d["index"])]
        return vectors[0] if isinstance(input, str) else vectors

    def tokenize(self, text: Union[bytes, str], add_bos: bool = True, special: bool = False) -> List[int]:
        """Token ids of ``text``; ``special``: control-token text such as
        ``<start_of_turn>`` becomes those tokens instead of plain text."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        out = self._call(
            "POST", "/tokenize", {"prompt": text, "add_special_tokens": add_bos, "parse_special": special}
        )
        return out["tokens"]

    def detokenize(
        self, tokens: List[int], prev_tokens: Optional[List[int]] = None, special: bool = False
    ) -> bytes:
        """The text of ``tokens`` as UTF-8 bytes (llama-cpp-python's type)."""
        text = self._call("POST", "/detokenize", {"tokens": list(tokens)})["prompt"]
        if prev_tokens:
            before = self._call("POST", "/detokenize", {"tokens": list(prev_tokens)})["prompt"]
            whole = self._call("POST", "/detokenize", {"tokens": list(prev_tokens) + list(tokens)})["prompt"]
            if whole.startswith(before):
                text = whole[len(before) :]
        return text.encode("utf-8")

    # -- what the engine is ----------------------------------------------------

    def props(self) -> Dict[str, Any]:
        """``/props``: the model, context, KV pool, speculation, threads, ISA."""
        if self._props is None:
            self._props = self._call("GET", "/props")
        return self._props

    def n_ctx(self) -> int:
        return int(self.props()["context_length"])

    def metrics(self) -> str:
        """The Prometheus text of ``/metrics`` (vLLM's and Spindle's names)."""
        return self._call("GET", "/metrics")

    def request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        """Any request of ``spindle serve``'s API, answered in process
        (what ``spindle.ray_serve`` forwards)."""
        return self._call(method, path, body)

    def stream(self, path: str, body: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
        """A streaming request of the server's API: its chunks, decoded."""
        return self._stream(path, body)


def _llama_only(extra: Dict[str, Any]) -> Dict[str, Any]:
    """llama-cpp-python's sampling arguments that Spindle's sampler does not
    have, as ``name: (given, default)`` (popped from ``extra``)."""
    defaults = {
        "tfs_z": 1.0,
        "mirostat_mode": 0,
        "mirostat_tau": 5.0,
        "mirostat_eta": 0.1,
        "stopping_criteria": None,
        "logits_processor": None,
    }
    return {k: (extra.pop(k), d) for k, d in defaults.items() if k in extra}


def _check_unsupported(**given: Any) -> None:
    for name, (value, default) in given.items():
        if value != default:
            raise ValueError(
                f"{name}={value!r}: Spindle's sampler does not have this; "
                "it has temperature, top_k, top_p, min_p and the penalties"
            )
