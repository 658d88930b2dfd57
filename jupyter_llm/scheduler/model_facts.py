"""GGUF facts the scheduler plans with, read off the event loop and once per
file: blobs are content-addressed, so a path's facts never change."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from jupyter_llm.memory import ModelInfo
from jupyter_llm.memory.projector import ProjectorInfo

T = TypeVar("T")

CACHED_FILES = 256  # per kind; the cache starts over beyond it


class ModelFacts:
    """A model's (and a draft model's) ``ModelInfo`` and a projector's
    ``ProjectorInfo``, cached."""

    def __init__(
        self,
        read_info: Callable[[Path], ModelInfo],
        read_projector: Callable[[Path], ProjectorInfo],
    ) -> None:
        self._read_info = read_info
        self._read_projector = read_projector
        self._infos: dict[Path, ModelInfo] = {}
        self._projectors: dict[Path, ProjectorInfo] = {}

    async def model(self, path: Path) -> ModelInfo:
        return await _cached(self._infos, self._read_info, path)

    async def draft(self, path: Path | None) -> ModelInfo | None:
        """A draft model's facts (``ModelEntry.draft_path``), None without one."""
        return None if path is None else await self.model(path)

    async def projector(self, path: Path | None) -> ProjectorInfo | None:
        if path is None:
            return None
        return await _cached(self._projectors, self._read_projector, path)


async def _cached(cache: dict[Path, T], read: Callable[[Path], T], path: Path) -> T:
    if (info := cache.get(path)) is None:
        loop = asyncio.get_running_loop()
        info = await loop.run_in_executor(None, read, path)
        if len(cache) >= CACHED_FILES:
            cache.clear()
        cache[path] = info
    return info
