"""Long-form transcription: the seek loop over 30 s windows (``seek``), its windows (``window``), the seek guard
(``guard``), hallucination skipping (``hallucinations``), word times (``words``), ``vad_filter``'s loop over the
speech (``speech``) and batched mode as lanes of sequential loops (``lanes``)."""
