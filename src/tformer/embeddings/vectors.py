"""Vectors a user brings: a .npy file of (N, D) float rows (`index build --vectors`,
`search --query-vectors`), checked in one line naming the file and read a block at a time.

    source = VectorsFile("V.npy", "--vectors")          # header checked: 2-D, float, C order
    for first, block in source.blocks(): ...             # (b, D) float32, each row finite

Read with plain reads, never a memory map (whose pages would stay resident: memory would grow
with the file) and never with pickle (np.load's allow_pickle stays off: an object array is refused).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

BLOCK = 65_536  # rows read at a time


class VectorsFile:
    def __init__(self, path: str | Path, option: str, dim: int | None = None) -> None:
        self.path, self.option = Path(path), option
        where = f"{option} {self.path}"
        try:
            with self.path.open("rb") as f:
                version = np.lib.format.read_magic(f)
                read = {(1, 0): np.lib.format.read_array_header_1_0,
                        (2, 0): np.lib.format.read_array_header_2_0,
                        (3, 0): getattr(np.lib.format, "read_array_header_2_0", None)}.get(version)
                if read is None:
                    raise ValueError(f"npy format version {version}")
                shape, fortran, dtype = read(f)
                self.offset = f.tell()
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            raise FileNotFoundError(f"{where}: no such file") from None
        except (OSError, ValueError, SyntaxError) as e:
            raise ValueError(f"{where}: expected a .npy file of float vectors (N, D), got something "
                             f"else ({e})") from None
        if dtype.kind != "f" or dtype.hasobject:
            raise ValueError(f"{where}: expected float vectors (float16, float32 or float64), got "
                             f"dtype {dtype}")
        if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
            raise ValueError(f"{where}: expected a 2-D array (N, D) with N, D >= 1, got shape {shape}")
        if dim is not None and shape[1] != dim:
            raise ValueError(f"{where}: expected vectors of width {dim} (the index's), got {shape[1]}")
        if fortran and shape[0] > 1 and shape[1] > 1:
            raise ValueError(f"{where}: expected a row-major (C order) array, got Fortran order "
                             "(np.save(path, np.ascontiguousarray(x)))")
        expected = self.offset + shape[0] * shape[1] * dtype.itemsize
        if size != expected:
            raise ValueError(f"{where}: expected {expected} bytes for {dtype} {shape}, got {size} "
                             "(truncated or damaged)")
        self.shape: tuple[int, int] = (int(shape[0]), int(shape[1]))
        self.dtype = dtype

    def blocks(self, size: int = BLOCK) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, (b, D) float32 rows); a row with a NaN or an infinity is refused, named."""
        n, d = self.shape
        with self.path.open("rb") as f:
            f.seek(self.offset)
            for first in range(0, n, size):
                b = min(size, n - first)
                block = np.fromfile(f, dtype=self.dtype, count=b * d).reshape(b, d)
                if len(block) != b:
                    raise ValueError(f"{self.option} {self.path}: changed while it was read")
                with np.errstate(over="ignore"):
                    block = block.astype(np.float32)  # a float64 past float32's range: inf, refused below
                bad = ~np.isfinite(block).all(axis=1)
                if bad.any():
                    raise ValueError(f"{self.option} {self.path}: row {first + int(bad.argmax())}: expected "
                                     "finite numbers, got NaN or infinity")
                yield first, block

    def read(self) -> np.ndarray:
        """All rows, (N, D) float32 (queries: they are held anyway)."""
        return np.concatenate([b for _, b in self.blocks()])
