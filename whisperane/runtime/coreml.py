"""Core ML, in one place (macOS): the component (``CoreMLComponent``), the stateful decoder whose caches live in
an MLState (``StatefulDecoder``, ``MLStateRows``) and whether this system has MLState."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ..contract import (
    ALIGNMENT_WEIGHTS,
    CACHE_LENGTH,
    INPUT_IDS,
    KEY_CACHE,
    LOGITS,
    MASK_VALUE,
    PADDING_MASK,
    UPDATE_MASK,
    VALUE_CACHE,
)
from ..errors import ModelError
from .decoder_adapters import CacheLayout, CrossAttention, Decoder, OneHotDecoder
from .executors import Component
from .state import DecoderState, StatePool


def coreml_has_state() -> bool:
    """MLState needs macOS 15 (the stateful decoder's deployment target)."""
    import platform

    release = platform.mac_ver()[0]
    return sys.platform == "darwin" and bool(release) and int(release.split(".")[0]) >= 15


class CoreMLComponent:
    """A Core ML model (.mlmodelc through the compiled-model API, .mlpackage otherwise). macOS only.

    ``inputs``/``outputs`` map names to shapes as the package declares them, a flexible dimension (the stateless
    TextDecoder's rows) named like ONNX's symbolic ones (``batch``); ``states`` the MLState shapes."""

    def __init__(self, path: Path, compute_units: str = "ALL"):
        if sys.platform != "darwin":
            raise ModelError(f"{path}: the Core ML executor needs macOS; use --executor onnx here")
        import coremltools as ct

        units = getattr(ct.ComputeUnit, compute_units.upper(), None)
        if units is None:
            raise ModelError(f"unknown compute units {compute_units!r}; use ALL, CPU_ONLY, CPU_AND_GPU or CPU_AND_NE")
        try:
            if path.suffix == ".mlmodelc":
                self.model = ct.models.CompiledMLModel(str(path), compute_units=units)
                spec = None
            else:
                self.model = ct.models.MLModel(str(path), compute_units=units)
                spec = self.model.get_spec()
        except Exception as e:
            raise ModelError(f"{path}: cannot load Core ML model ({e})") from None
        self.name = path.stem.split(".")[0]
        if spec is None:
            package = path.with_suffix(".mlpackage")
            spec = ct.utils.load_spec(str(package)) if package.exists() else None
        features = (lambda which: getattr(spec.description, which)) if spec else (lambda which: [])
        self.inputs = {f.name: coreml_shape(f) for f in features("input")}
        self.outputs = {f.name: coreml_shape(f) for f in features("output")}
        self.states = {f.name: coreml_shape(f) for f in features("state")}

    def release_weights(self) -> None:
        pass  # Core ML keeps its own copy of the weights

    def make_state(self):
        """A fresh MLState for a stateful package: each decoding call holds its own."""
        return self.model.make_state()

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None, state=None) -> dict[str, np.ndarray]:
        out = self.model.predict(feeds) if state is None else self.model.predict(feeds, state=state)
        return {k: np.asarray(v) for k, v in out.items() if outputs is None or k in outputs}

    def run_into(self, feeds: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
        for name, value in self.run(feeds, list(outputs)).items():
            np.copyto(outputs[name], value.reshape(outputs[name].shape))


def coreml_shape(feature) -> tuple:
    """A Core ML feature's shape: ints, a ranged dimension as ``batch`` (the only one our packages range)."""
    kind = feature.type.WhichOneof("Type")
    array = feature.type.stateType.arrayType if kind == "stateType" else feature.type.multiArrayType
    ranges = list(array.shapeRange.sizeRanges)
    if len(ranges) != len(array.shape):
        return tuple(int(d) for d in array.shape)
    return tuple(int(d) if r.lowerBound == r.upperBound else "batch" for d, r in zip(array.shape, ranges, strict=True))


class StatefulDecoder(OneHotDecoder):
    """Core ML's stateful decoders (macOS 15 / iOS 18): the caches live in an MLState that belongs to the
    call's state (``MLStateRows``); the host keeps only the masks and positions. A state's rows are fixed when
    the package is converted: TextDecoderStateful (``component``) has 1 row; TextDecoderStatefulBeam
    (``batched``, when the bundle has it) has 5, for beams or samples of one window; a group of fewer rows
    leaves the rest idle. Beams are reordered through the MLState (``MLStateRows.select``)."""

    def __init__(
        self, layout: CacheLayout, component: Component, batched: Component | None = None
    ):
        super().__init__(layout, component)
        self.batched = batched
        self.pool = StatePool(self._new_state)

    def _new_state(self, batch: int) -> DecoderState:
        if batch == 1:
            return MLStateRows(self.layout, batch, self.component)
        if self.batched is not None and batch <= package_rows(self.batched):
            return MLStateRows(self.layout, batch, self.batched)
        most = package_rows(self.batched) if self.batched is not None else 1
        raise ModelError(
            f"the stateful Core ML decoder runs at most {most} rows at once, not {batch} "
            "(beam_size and best_of up to that; rebuild the bundle for TextDecoderStatefulBeam)"
        )

    def step(self, state, tokens, cross):
        if cross.batch != 1:
            raise ModelError(
                "the stateful Core ML decoder takes one window's cross K/V; decode windows one at a time"
            )
        self._mark_position(state)
        out = state.component.run(state.step_feeds(tokens, cross), state=state.native)
        state.lengths += 1
        return out[LOGITS][: state.batch, 0, :], out[ALIGNMENT_WEIGHTS][: state.batch]

    def forward(self, state, tokens, cross, need_logits=True):
        return Decoder.forward(self, state, tokens, cross, need_logits)


STATE_NAMES = (KEY_CACHE, VALUE_CACHE)


def package_rows(component: Component) -> int:
    """The fixed number of rows of a stateful package (its ``input_ids`` length)."""
    shape = component.inputs.get(INPUT_IDS, (1,))
    return int(shape[0]) if shape and isinstance(shape[0], int) else 1


class MLStateRows(DecoderState):
    """The state of one call through a stateful Core ML decoder: ``batch`` rows of a package with P >= batch
    fixed rows. The caches are the package's MLState (``native``, [P, d*L, 1, S] each); the host keeps masks
    and positions for all P rows, rows past ``batch`` idle (zero update mask, so their state never changes;
    fully masked). Cache rows move through ``MLState.read_state``/``write_state`` (coremltools >= 8.1): the
    forced prefix copied from another state, host-side writes (the prefill table), beam reordering. A reorder
    reads and writes both caches whole (tiny.en at 5 rows: 2 x 6.9 MB of fp16 each way a step)."""

    def __init__(self, layout: CacheLayout, batch: int, component: Component):
        rows = package_rows(component)
        self.layout, self.batch, self.component = layout, batch, component
        self._update_rows = np.zeros((rows, layout.length), dtype=np.float32)
        self._padding_rows = np.full((rows, layout.length), MASK_VALUE, dtype=np.float32)
        self._length_rows = np.zeros(rows, dtype=np.int32)
        self._token_rows = np.zeros(rows, dtype=np.int32)
        # views: the host's rows of the arrays fed whole
        self.update, self.padding = self._update_rows[:batch], self._padding_rows[:batch]
        self.lengths = self._length_rows[:batch]
        self.rows = np.arange(batch)
        self.keys, self.values, self.cache_feeds, self._spare = [], [], {}, None  # no host caches
        self.native = component.make_state()

    def step_feeds(self, tokens: np.ndarray, cross: CrossAttention) -> dict[str, np.ndarray]:
        self._token_rows[: self.batch] = tokens
        return {INPUT_IDS: self._token_rows, CACHE_LENGTH: self._length_rows, UPDATE_MASK: self._update_rows,
                PADDING_MASK: self._padding_rows, **cross.feeds}

    def caches(self) -> list[np.ndarray]:
        """Copies of the MLState's caches (key, value), [P, d*L, 1, S] in the state's precision (fp16)."""
        try:
            return [np.array(self.native.read_state(name)) for name in STATE_NAMES]
        except AttributeError:  # coremltools 8.0's MLState has no read_state
            raise ModelError("the stateful Core ML decoder needs coremltools >= 8.1 (MLState.read_state); "
                             "pip install -U coremltools") from None

    def _store(self, caches: list[np.ndarray]) -> None:
        for name, cache in zip(STATE_NAMES, caches, strict=True):
            self.native.write_state(name, cache)

    def write(self, key: np.ndarray, value: np.ndarray) -> None:
        t = key.shape[3]
        self.check_room(t)
        self.open(t)
        caches = self.caches()
        for cache, update in zip(caches, (key, value), strict=True):
            for r, start in enumerate(self.lengths):
                cache[r, :, :, start : start + t] = update[r if update.shape[0] > 1 else 0]
        self._store(caches)
        self.lengths += t

    def _source(self, other: DecoderState) -> list[np.ndarray]:
        return other.caches() if isinstance(other, MLStateRows) else [other.keys[0], other.values[0]]

    def copy_prefix_from(self, other: DecoderState) -> None:
        n = int(other.lengths[0])
        caches = self.caches()
        for cache, source in zip(caches, self._source(other), strict=True):
            cache[: self.batch, :, :, :n] = source[:1, :, :, :n]
        self._store(caches)
        self.padding[:, :n] = 0.0
        self.padding[:, n:] = MASK_VALUE
        self.lengths[:] = n

    def set_row(self, row: int, other: DecoderState, other_row: int = 0) -> None:
        n = int(other.lengths[other_row])
        caches = self.caches()
        for cache, source in zip(caches, self._source(other), strict=True):
            cache[row, :, :, :n] = source[other_row, :, :, :n]
        self._store(caches)
        self.padding[row] = other.padding[other_row]
        self.lengths[row] = n

    def first_rows(self, n: int) -> DecoderState | None:
        return None  # the rows live in one MLState: finished rows stay in the batch, fed <|endoftext|>

    def select(self, rows: np.ndarray) -> None:
        """Reorder or duplicate rows (beams): read the caches, gather rows up to the longest, write back."""
        rows = np.asarray(rows)
        if (rows == self.rows).all():
            return
        n = self.length
        caches = self.caches()
        for cache in caches:
            cache[: self.batch, :, :, :n] = cache[rows, :, :, :n]
        self._store(caches)
        self.padding[:] = self.padding[rows]
        self.lengths[:] = self.lengths[rows]
