"""Speaker labels (diarization): who spoke when, on every word (docs/DESIGN.md §9).

The speaker model is Resemblyzer's GE2E voice encoder (Apache-2.0; ``resemblyzer/pretrained.pt`` from its wheel on
PyPI), converted once by the build side into an ONNX component (``convert/speaker.py``) and run here through ONNX
Runtime over a numpy mel power spectrogram: no torch, librosa or webrtcvad at run time.
"""
