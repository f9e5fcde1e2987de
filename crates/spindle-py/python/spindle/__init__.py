"""Spindle from Python.

``spindle.Llama`` has llama-cpp-python's shape: ``Llama(model_path=None)``
loads the default model (Gemma 3 270M, fetched on first use),
``create_completion`` / ``create_chat_completion`` return the same
OpenAI-shaped dicts (or iterators of chunks with ``stream=True``). Behind it
runs the engine of ``spindle serve`` in this process: continuous batching,
tree speculation, structured output and tools, with the server's own checks
and error messages.
"""

from ._native import __version__
from .llama import Llama, SpindleError

__all__ = ["Llama", "SpindleError", "__version__"]
