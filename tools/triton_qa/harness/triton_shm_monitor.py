"""A stand-in for the ``triton_shm_monitor`` extension that Triton's qa build compiles for
``qa/common/shm_util.py`` (its shared-memory leak probe of the Python backend's regions).

The runner puts this folder on the test process's ``PYTHONPATH`` for both servers. Every region
reports the same free size on every read, so the probe never reports a leak: a leak in
tritonserver's Python-backend regions is a Triton internal, and this server has no such regions
(the probe then finds none in ``/dev/shm`` and checks nothing). Without the module, every test of
a suite that builds the probe fails on import before it sends a request.
"""

from __future__ import annotations


class SharedMemoryManager:
    """The region named ``name`` in ``/dev/shm``; ``free_memory()`` is the same number every time."""

    def __init__(self, name: str) -> None:
        self.name = name

    def free_memory(self) -> int:
        return 0
