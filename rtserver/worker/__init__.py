"""The GPU worker process and the front end's link to it (issue 24).

A GPU worker (``proc``: ``rtserver worker``) owns the voices of the GPU
families (their token engines and vocoders) for one GPU and serves
``Voice.synthesize`` over ZMQ; front-end processes (the ordinary server:
sockets, sessions, segmenting, pacing, Opus, admission) reach those voices
through ``remote.RemoteVoice`` and never import torch. ``messages`` is the
typed contract between them, ``placement`` says which voices go where and
the worker's capacity, ``sockets`` the non-blocking send both sides use.
"""
