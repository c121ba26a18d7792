"""Content-addressed, encrypted blob store for transcripts and client data.

Why: the trainer's transcript (checkpoints, rounding log) and the client's data must reach the
auditor and the judge through a store that may be shared or public, while only hashes go on-chain.
So every blob is sealed with AES-256-GCM under a key the client hands to trainer, auditor and judge,
and addressed by the SHA-256 of the *sealed* bytes: anyone can check integrity, only key holders
can read. No torch here. The package, by concern:

* :mod:`game.store.sealing`: the sealed blob format (segments, nonces, v1 blobs) and ``StoreError``;
* :mod:`game.store.keys`: data keys (new, parsed from text, fingerprinted);
* :mod:`game.store.blobs`: the directory store of blobs named by their hash (``BlobStore``);
* :mod:`game.store.archive`: directories (transcripts) published as one blob, fetched, read in part.
"""
