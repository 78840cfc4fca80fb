"""``whisperane batch``: the Ray Data command (``command``), its Dataset of transcription rows (``dataset``), the
inputs it reads (``inputs``) and the resumable shards it writes (``shards``). Needs ``whisperane[ray]``."""
