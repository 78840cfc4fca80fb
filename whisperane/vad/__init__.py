"""Voice activity detection: Silero VAD through ONNX Runtime (no torch), faster-whisper's rules on top.

The model is Silero VAD v6.0 in its sequence form (MIT; ``silero_vad_v6.onnx`` from the ``faster-whisper``
wheel on PyPI, the model of silero-vad 6.0.0; silero-vad 6.2.3's ``silero_vad_16k_sequence.onnx`` is the
alternative ``"v6.2.3"``). One call scores many 32 ms windows (rows of 512 samples plus the 64 before them)
and returns the LSTM state, which is carried into the next call, so a long file is scored block by block
over :class:`whisperane.audio.AudioStream` in bounded memory (only the probabilities, 4 bytes per 32 ms, are
kept). The wheel is fetched at first use with
``pip download --no-deps``, the model checked against its sha256 and cached under the user cache; offline,
``$WHISPERANE_VAD_MODEL`` names a copy of the file.

:func:`get_speech_timestamps` follows faster-whisper's ``get_speech_timestamps`` (same options, defaults and
state machine) and :class:`SpeechTimestampsMap` puts times measured on speech-only audio back on the original
audio. For the sequential loop with ``vad_filter``, :func:`speech_stream` presents only the speech
of an audio, read like an ``AudioStream`` in bounded memory, and ``longform.words.restore_timestamps`` puts the
transcript's times back on the original audio (faster-whisper's ``restore_speech_timestamps``).
"""
