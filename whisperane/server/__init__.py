"""``whisperane serve``: an OpenAI-compatible HTTP server (files, streamed results, live audio) with a page.

Needs the ``server`` extra (``pip install 'whisperane[server]'``); this package's modules import FastAPI, so
only ``command`` (the CLI's parser and entry) is imported by ``whisperane.command``, and it imports the rest lazily.
"""
