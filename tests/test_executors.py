"""ONNX Runtime sessions from the saved optimized graph (executors.OnnxComponent's cache): the same outputs as
the component itself, and a damaged cache rebuilt rather than trusted."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from whisperane.executors import CACHED_GRAPH, CACHED_WEIGHTS, OnnxComponent

pytestmark = pytest.mark.slow


@pytest.fixture
def encoder_copy(tiny_en_bundle, tmp_path):
    """The tiny.en int8 encoder (prepacked int8 MatMuls, ONNX Runtime's MultiHeadAttention) in a fresh folder."""
    path = tmp_path / "AudioEncoder.int8.onnx"
    shutil.copy(tiny_en_bundle / path.name, path)
    return path


def _outputs(path) -> dict[str, np.ndarray]:
    component = OnnxComponent(path, threads=2)
    name, shape = next(iter(component.inputs.items()))
    mel = np.random.default_rng(0).standard_normal((1, *shape[1:])).astype(np.float32)
    return component.run({name: mel})


def test_cached_graph_gives_the_components_outputs(encoder_copy):
    built = _outputs(encoder_copy)  # optimizes the component and saves the graph and prepacked weights
    (cache,) = (encoder_copy.parent / ".ort-cache").iterdir()
    assert sorted(p.name for p in cache.iterdir()) == sorted([CACHED_GRAPH, CACHED_WEIGHTS])
    stale = cache.parent / f"{encoder_copy.stem}.{'0' * 16}.ort"  # an earlier version's ORT-format cache
    stale.write_bytes(b"old")
    cached = _outputs(encoder_copy)
    assert built.keys() == cached.keys()
    for name, value in built.items():
        np.testing.assert_array_equal(cached[name], value)
    assert stale.exists()  # only a rebuild cleans up

    weights = cache / CACHED_WEIGHTS
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])  # truncated: refused by ONNX Runtime, rebuilt
    rebuilt = _outputs(encoder_copy)
    for name, value in built.items():
        np.testing.assert_array_equal(rebuilt[name], value)
    assert weights.stat().st_size == size
    assert not stale.exists()
