"""Types of the native module (``crates/spindle-py/src/lib.rs``)."""

from typing import Iterator, List, Optional, Tuple

__version__: str

class Engine:
    """A model served in this process, started with ``spindle serve``'s flags."""

    name: str
    summary: str

    def __init__(self, argv: List[str]) -> None: ...
    def request(self, method: str, path: str, body: Optional[str] = None) -> Tuple[int, str]: ...
    def stream(self, path: str, body: str) -> Tuple[int, str, Optional["EventStream"]]: ...

class EventStream(Iterator[str]):
    """The ``data`` of each server-sent event; closing it cancels the request."""

    def __iter__(self) -> "EventStream": ...
    def __next__(self) -> str: ...
    def close(self) -> None: ...
