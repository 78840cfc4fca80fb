"""The component contract shared by the converter (which writes bundles) and the runtime (which reads them):
component names, tensor names, the mask value, and the versions a bundle records (docs/DESIGN.md §2, §3).
Imports nothing of whisperane: both sides import it."""

from __future__ import annotations

CONTRACT_VERSION = 1
# Bumped whenever the converter's output changes for the same source and options. A bundle made by an older
# converter is refused with a rebuild command (runtime.bundle.read_config) and rebuilt by `whisperane convert`.
CONVERTER_REVISION = 17
CONFIG_NAME = "config.json"

# decoder_key_padding_mask for positions not attended: additive; -inf would turn fully masked rows into NaN
MASK_VALUE = -1e4

# components
MEL_SPECTROGRAM = "MelSpectrogram"
AUDIO_ENCODER = "AudioEncoder"
TEXT_DECODER = "TextDecoder"
TEXT_DECODER_SEQUENCE = "TextDecoderSequence"
TEXT_DECODER_PREFILL = "TextDecoderContextPrefill"
# the components an ONNX conversion exports (a step each in its progress)
ONNX_COMPONENTS = (MEL_SPECTROGRAM, AUDIO_ENCODER, TEXT_DECODER, TEXT_DECODER_SEQUENCE, TEXT_DECODER_PREFILL)

# MelSpectrogram
AUDIO = "audio"
MEL_FEATURES = "melspectrogram_features"
# AudioEncoder
ENCODER_OUTPUT = "encoder_output_embeds"
CROSS_KEY = "encoder_attn_key_cache"
CROSS_VALUE = "encoder_attn_value_cache"
# TextDecoder (and TextDecoderSequence)
INPUT_IDS = "input_ids"
CACHE_LENGTH = "cache_length"
KEY_CACHE = "key_cache"
VALUE_CACHE = "value_cache"
UPDATE_MASK = "kv_cache_update_mask"
PADDING_MASK = "decoder_key_padding_mask"
LOGITS = "logits"
KEY_UPDATES = "key_cache_updates"
VALUE_UPDATES = "value_cache_updates"
ALIGNMENT_WEIGHTS = "alignment_heads_weights"
# TextDecoderSequence only: which new tokens get logits, and the text-vocabulary log-probabilities of given
# tokens at given positions (the alignment pass)
LOGIT_POSITIONS = "logit_positions"
LOGPROB_POSITIONS = "logprob_positions"
LOGPROB_TOKENS = "logprob_tokens"
TOKEN_LOGPROBS = "token_logprobs"
# the int8 TextDecoderSequence: the host looks the tokens up in TokenEmbedding.int8.npy
TOKEN_EMBEDDINGS = "token_embeddings"
# TextDecoderContextPrefill
PREFILL_TASK = "task"
PREFILL_LANGUAGE = "language"
KEY_PREFILL = "key_cache_prefill"
VALUE_PREFILL = "value_cache_prefill"

DECODER_INPUTS = (INPUT_IDS, CACHE_LENGTH, KEY_CACHE, VALUE_CACHE, UPDATE_MASK, PADDING_MASK, CROSS_KEY, CROSS_VALUE)
DECODER_OUTPUTS = (LOGITS, KEY_UPDATES, VALUE_UPDATES, ALIGNMENT_WEIGHTS)
