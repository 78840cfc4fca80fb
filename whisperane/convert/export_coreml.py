"""Core ML export of the components (ML Program ``.mlpackage``s, docs/DESIGN.md §2-3).

Every package has the contract's tensor names. Inputs and outputs are float32 (int32 for ids, lengths, task and
language) like the ONNX exports, so both executors feed the same arrays; inside, the MelSpectrogram computes in
float32 (its 1e-10 floor underflows in fp16) and the other components in float16.

Written into the bundle:

- ``MelSpectrogram``, ``AudioEncoder``, ``TextDecoderContextPrefill`` ``.mlpackage`` (macOS 13 / iOS 16
  targets) at batch 1, fixed shapes;
- ``TextDecoder.mlpackage`` (macOS 13): the stateless decoder, taking and returning the caches as in ONNX,
  with a flexible batch (docs/DESIGN.md §8): every per-row input (``input_ids``, ``cache_length``, the caches, both
  masks) has B rows, B a ``RangeDim`` 1..MAX_DECODER_BATCH shared by all of them (one symbol), default 1; the
  cross K/V have their own batch 1..MAX_DECODER_BATCH, 1 for beams or samples of one window (broadcast to the
  B rows by the attention matmuls, never tiled) or B for B windows. Why a range and not ``EnumeratedShapes``:
  coremltools accepts enumerated shapes on more than one input only from iOS 18 / macOS 15 on (and then pairs
  the inputs' shapes by index, apple/coremltools#2271), which would take the stateless decoder's macOS 13 / 14
  users away; a bounded range works from macOS 13. Core ML specializes the default shape (B = 1, greedy) and
  may run other batches off the Neural Engine; 8 covers beam and best-of 5 (openai's and faster-whisper's
  defaults) and faster-whisper's batch of 8 windows;
- ``TextDecoderStateful.mlpackage`` (macOS 15 / iOS 18): the same decoder with ``key_cache``/``value_cache``
  held in MLState, so neither cache crosses the call boundary; its inputs are the stateless ones without the
  caches, its outputs ``logits`` and ``alignment_heads_weights``; batch 1; listed as TextDecoder's
  ``coreml_stateful``;
- ``TextDecoderStatefulBeam.mlpackage`` (macOS 15): the stateful decoder at BEAM_BATCH rows, the cross K/V at
  batch 1 (broadcast inside), listed as ``coreml_stateful_beam``. A state's shape is fixed at conversion
  (``StateType`` takes no flexible shape) and every per-row input must match it, so the rows are a fixed
  number: 5, the default beam size and best-of. The runtime runs up to 5 rows in it (rows past a smaller group
  idle: all-zero update mask, so their state never changes) and reorders beams by reading the MLState,
  gathering the rows on the host and writing it back (``runtime.coreml.MLStateRows``);
- with ``palettize`` (4, 6 or 8 bits, on request only): k-means palettized copies of the weight-heavy
  components next to the fp16 ones, ``AudioEncoder.palettized.mlpackage``,
  ``TextDecoder.palettized.mlpackage``, ``TextDecoderStateful.palettized.mlpackage`` and
  ``TextDecoderStatefulBeam.palettized.mlpackage``, listed as ``coreml_palettized``,
  ``coreml_stateful_palettized`` and ``coreml_stateful_beam_palettized``. The fp16 packages stay so the
  runtime can fall back and a user can compare their WER. The mel and prefill components are not palettized:
  they hold no learned matrices worth it.

Core ML's runtime (``predict``, compilation) exists only on macOS; on Linux the packages are built and their
specs can be inspected.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from collections.abc import Callable, Collection
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .. import contract
from ..contract import (
    ALIGNMENT_WEIGHTS,
    AUDIO,
    CROSS_KEY,
    CROSS_VALUE,
    ENCODER_OUTPUT,
    KEY_CACHE,
    KEY_PREFILL,
    LOGITS,
    MEL_FEATURES,
    VALUE_CACHE,
    VALUE_PREFILL,
)
from ..dims import ModelDimensions
from ..errors import ConversionError
from .export_onnx import DECODER_OUTPUTS, decoder_example
from .modules import TextDecoder, TextDecoderContextPrefill

STATELESS_TARGET = "macOS13"  # ML Program with fp16 compute: macOS 13 / iOS 16
STATEFUL_TARGET = "macOS15"  # MLState: macOS 15 / iOS 18
PALETTIZE_BITS = (4, 6, 8)
MAX_DECODER_BATCH = 8  # rows (and cross K/V batch) of the stateless TextDecoder: 1..8
BEAM_BATCH = 5  # rows of TextDecoderStatefulBeam (openai's and faster-whisper's beam_size and best_of)
# Tensors with this many elements or fewer stay fp16 (coremltools palettizes only tensors with more): biases and
# norms (at most 4 * 1280 = 5120, large-v3's fc1 bias). Every weight matrix is larger (the smallest, tiny's conv1,
# has 80 * 384 * 3); above 10,000 fp16 elements coremltools clusters with its bundled exact 1-D k-means, below it
# would need scikit-learn.
PALETTIZE_WEIGHT_THRESHOLD = 16384

MEL_OUTPUTS = [MEL_FEATURES]
ENCODER_OUTPUTS = [ENCODER_OUTPUT, CROSS_KEY, CROSS_VALUE]
DECODER_INPUTS = list(contract.DECODER_INPUTS)
CACHE_NAMES = (KEY_CACHE, VALUE_CACHE)
STATEFUL_INPUTS = [n for n in DECODER_INPUTS if n not in CACHE_NAMES]
STATEFUL_OUTPUTS = [LOGITS, ALIGNMENT_WEIGHTS]
PREFILL_OUTPUTS = [KEY_PREFILL, VALUE_PREFILL]


def _ct():
    """coremltools, imported late: it is an optional dependency and noisy on import outside macOS."""
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            import coremltools as ct
        except ImportError:
            raise ConversionError(
                "Core ML export needs coremltools: pip install 'coremltools>=8.0' (or whisperane[convert])"
            ) from None
    _patch_int_conversion()
    return ct


_int_patched = False


def _patch_int_conversion() -> None:
    """Let ``aten::Int`` fold a one-element constant array (coremltools 9 calls ``int()`` on it, which
    numpy >= 2 refuses). Traced shape arithmetic such as ``d // n_head`` in split_heads produces these."""
    global _int_patched
    if _int_patched:
        return
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.frontend.torch import ops
    from coremltools.converters.mil.frontend.torch.torch_op_registry import register_torch_op

    def _int(context, node):
        x = ops._get_inputs(context, node, expected=1)[0]
        if x.can_be_folded_to_const() and np.size(x.val) == 1:
            context.add(mb.const(val=int(np.asarray(x.val).reshape(-1)[0]), name=node.name), node.name)
        else:
            ops._cast(context, node, int, "int32")

    register_torch_op(_int, torch_alias=["int"], override=True)
    _int_patched = True


@contextlib.contextmanager
def _quiet():
    """Hide coremltools' per-pass progress bars and warnings (tqdm writes to sys.stderr); errors still raise."""
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _tensor_type(ct, name: str, example: Tensor, batch=None):
    """A fixed-shape input like ``example``, or with ``batch`` (a ``RangeDim``) as its first dimension."""
    dtype = np.int32 if example.dtype == torch.int32 else np.float32
    if batch is None:
        return ct.TensorType(name=name, shape=tuple(example.shape), dtype=dtype)
    rest = tuple(example.shape[1:])
    shape = ct.Shape((batch, *rest), default=(batch.default, *rest))
    return ct.TensorType(name=name, shape=shape, dtype=dtype)


def _convert(
    module: nn.Module,
    examples: dict[str, Tensor],
    outputs: list[str],
    *,
    precision: str = "float16",
    target: str = STATELESS_TARGET,
    states: dict[str, tuple[int, ...]] | None = None,
    batch_dims: Callable[[object], dict[str, object]] | None = None,
):
    """Trace ``module`` on ``examples`` (in order) and convert it to an ML Program; returns the MLModel.
    ``batch_dims(ct)`` gives the inputs whose first dimension is flexible (name -> ``RangeDim``)."""
    ct = _ct()
    flexible = batch_dims(ct) if batch_dims else {}
    with _quiet(), torch.no_grad():
        traced = torch.jit.trace(module.eval(), tuple(examples.values()), check_trace=False)
        mlmodel = ct.convert(
            traced,
            inputs=[_tensor_type(ct, n, t, flexible.get(n)) for n, t in examples.items()],
            outputs=[ct.TensorType(name=n, dtype=np.float32) for n in outputs],
            states=[
                ct.StateType(wrapped_type=ct.TensorType(shape=shape, dtype=np.float16), name=n)
                for n, shape in (states or {}).items()
            ]
            or None,
            convert_to="mlprogram",
            minimum_deployment_target=getattr(ct.target, target),
            compute_precision=ct.precision.FLOAT32 if precision == "float32" else ct.precision.FLOAT16,
            skip_model_load=True,  # loading needs the Core ML runtime (macOS); the package is complete without it
        )
    return mlmodel


class TextDecoderStateful(nn.Module):
    """TextDecoder with its self-attention caches in MLState.

    The caches are buffers named like the states. The wrapped decoder attends over them with the current
    token blended in; then the same one-hot blend is written back into the buffers in place, which the tracer
    records as a state write (only the column at ``kv_cache_update_mask`` changes).
    """

    def __init__(self, decoder: TextDecoder, cache_length: int, batch: int = 1):
        super().__init__()
        dims = decoder.dims
        self.decoder = decoder
        shape = (batch, dims.n_text_state * dims.n_text_layer, 1, cache_length)
        self.register_buffer(KEY_CACHE, torch.zeros(shape))
        self.register_buffer(VALUE_CACHE, torch.zeros(shape))

    def forward(
        self,
        input_ids: Tensor,
        cache_length: Tensor,
        kv_cache_update_mask: Tensor,
        decoder_key_padding_mask: Tensor,
        encoder_attn_key_cache: Tensor,
        encoder_attn_value_cache: Tensor,
    ) -> tuple[Tensor, Tensor]:
        logits, key_update, value_update, weights = self.decoder(
            input_ids,
            cache_length,
            self.key_cache,
            self.value_cache,
            kv_cache_update_mask,
            decoder_key_padding_mask,
            encoder_attn_key_cache,
            encoder_attn_value_cache,
        )
        upd = kv_cache_update_mask.unsqueeze(1).unsqueeze(2)  # [B, 1, 1, S]
        keep = 1.0 - upd
        self.key_cache[:] = self.key_cache * keep + key_update * upd
        self.value_cache[:] = self.value_cache * keep + value_update * upd
        return logits, weights


# --- one converter per component -------------------------------------------------------------------------


def convert_mel(module: nn.Module):
    return _convert(module, {AUDIO: torch.zeros(480000)}, MEL_OUTPUTS, precision="float32")


def convert_encoder(module: nn.Module, dims: ModelDimensions):
    return _convert(
        module, {MEL_FEATURES: torch.zeros(1, dims.n_mels, 1, 3000)}, ENCODER_OUTPUTS
    )


def _decoder_batch_dims(ct) -> dict[str, object]:
    """One symbol for the rows of every per-row input, another for the cross K/V's batch (1 or B)."""
    rows = ct.RangeDim(1, MAX_DECODER_BATCH, default=1, symbol="batch")
    windows = ct.RangeDim(1, MAX_DECODER_BATCH, default=1, symbol="encoder_batch")
    return {n: windows if n.startswith("encoder_") else rows for n in DECODER_INPUTS}


def convert_decoder(module: TextDecoder, dims: ModelDimensions, cache_length: int):
    """The stateless decoder with a flexible batch. Traced with 2 rows over batch-1 cross K/V, so the graph
    records the broadcast (at 1 row the two batches could not be told apart)."""
    example = decoder_example(dims, cache_length, batch=2)
    return _convert(module, example, DECODER_OUTPUTS, batch_dims=_decoder_batch_dims)


def convert_decoder_stateful(module: TextDecoder, dims: ModelDimensions, cache_length: int, batch: int = 1):
    """The MLState decoder at ``batch`` rows (fixed), the cross K/V at batch 1."""
    wrapper = TextDecoderStateful(module, cache_length, batch).eval()
    examples = {n: t for n, t in decoder_example(dims, cache_length, batch).items() if n not in CACHE_NAMES}
    shape = tuple(wrapper.key_cache.shape)
    return _convert(
        wrapper, examples, STATEFUL_OUTPUTS, target=STATEFUL_TARGET, states={n: shape for n in CACHE_NAMES}
    )


def convert_prefill(module: TextDecoderContextPrefill):
    examples = {"task": torch.zeros(1, dtype=torch.int32), "language": torch.zeros(1, dtype=torch.int32)}
    return _convert(module, examples, PREFILL_OUTPUTS)


def palettize_model(mlmodel, nbits: int):
    """k-means palettization of every weight with more than PALETTIZE_WEIGHT_THRESHOLD elements."""
    if nbits not in PALETTIZE_BITS:
        raise ConversionError(f"palettization takes 4, 6 or 8 bits, not {nbits}")
    _ct()
    from coremltools.optimize.coreml import OpPalettizerConfig, OptimizationConfig, palettize_weights

    config = OptimizationConfig(
        global_config=OpPalettizerConfig(
            nbits=nbits, mode="kmeans", weight_threshold=PALETTIZE_WEIGHT_THRESHOLD
        )
    )
    with _quiet():
        return palettize_weights(mlmodel, config)


def _save(mlmodel, path: Path, description: str) -> str:
    mlmodel.short_description = description
    mlmodel.author = "whisperane"
    mlmodel.save(str(path))
    return path.name


# package stem -> (component in config.json, kind)
PACKAGES = {
    "MelSpectrogram": ("MelSpectrogram", "coreml"),
    "AudioEncoder": ("AudioEncoder", "coreml"),
    "TextDecoder": ("TextDecoder", "coreml"),
    "TextDecoderStateful": ("TextDecoder", "coreml_stateful"),
    "TextDecoderStatefulBeam": ("TextDecoder", "coreml_stateful_beam"),
    "TextDecoderContextPrefill": ("TextDecoderContextPrefill", "coreml"),
}
PALETTIZED_PACKAGES = ("AudioEncoder", "TextDecoder", "TextDecoderStateful", "TextDecoderStatefulBeam")


def _build_package(build: Callable[[], object], path: Path):
    try:
        return build()
    except ConversionError:
        raise
    except Exception as e:  # coremltools reports unsupported ops and shape errors with many exception types
        raise ConversionError(f"{path}: Core ML conversion failed ({type(e).__name__}: {e})") from e


def export_all(
    out_dir: Path,
    dims: ModelDimensions,
    cache_length: int,
    *,
    mel: nn.Module,
    encoder: nn.Module,
    decoder: TextDecoder,
    prefill: TextDecoderContextPrefill,
    palettize: int | None = None,
    packages: Collection[str] | None = None,
    say: Callable[[str], None] = lambda _msg: None,
) -> dict[str, dict[str, str]]:
    """Write the Core ML packages into ``out_dir``; return ``{component: {kind: package name}}`` for config.json.

    Kinds: ``coreml``, and for TextDecoder ``coreml_stateful`` and ``coreml_stateful_beam``; with
    ``palettize`` (bits) also ``coreml_palettized`` (AudioEncoder, TextDecoder), ``coreml_stateful_palettized`` and
    ``coreml_stateful_beam_palettized`` (TextDecoder).
    ``packages`` limits the work to some stems of :data:`PACKAGES` (default: all).
    """
    if palettize is not None and palettize not in PALETTIZE_BITS:
        raise ConversionError(f"--palettize takes 4, 6 or 8 bits, not {palettize}")
    unknown = sorted(set(packages or ()) - set(PACKAGES))
    if unknown:
        raise ConversionError(f"unknown Core ML package {unknown[0]!r}; choose from {', '.join(PACKAGES)}")
    out_dir = Path(out_dir)
    s = cache_length
    builders: dict[str, Callable[[], object]] = {
        "MelSpectrogram": lambda: convert_mel(mel),
        "AudioEncoder": lambda: convert_encoder(encoder, dims),
        "TextDecoder": lambda: convert_decoder(decoder, dims, s),
        "TextDecoderStateful": lambda: convert_decoder_stateful(decoder, dims, s),
        "TextDecoderStatefulBeam": lambda: convert_decoder_stateful(decoder, dims, s, BEAM_BATCH),
        "TextDecoderContextPrefill": lambda: convert_prefill(prefill),
    }
    components: dict[str, dict[str, str]] = {}
    for stem, (component, kind) in PACKAGES.items():
        if packages is not None and stem not in packages:
            continue
        say(f"converting {stem}.mlpackage")
        t0 = time.time()
        mlmodel = _build_package(builders[stem], out_dir / f"{stem}.mlpackage")
        description = f"whisperane {stem} (contract v1, S={s})"
        components.setdefault(component, {})[kind] = _save(
            mlmodel, out_dir / f"{stem}.mlpackage", description
        )
        if palettize is not None and stem in PALETTIZED_PACKAGES:
            say(f"palettizing {stem} to {palettize} bits")
            small = palettize_model(mlmodel, palettize)
            name = _save(
                small, out_dir / f"{stem}.palettized.mlpackage", f"{description}, {palettize}-bit palettized"
            )
            components[component][f"{kind}_palettized"] = name
        say(f"{stem}: {time.time() - t0:.1f} s")
    return components
