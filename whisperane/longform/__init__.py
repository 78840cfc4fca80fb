"""Long-form transcription: the seek loop over 30 s windows (``seek``), one window's step (``step``: decode, words,
the speech guard), the windows themselves (``window``), the speech guard (``speech_guard``, asking ``voice`` where
the voice is), openai's hallucination skipping (``hallucinations``), word times (``words``), ``vad_filter``'s loop
over the speech (``vad_filter``) and batched mode as lanes of sequential loops (``lanes``)."""
