"""The pure engine of rayq: storage, policies and codecs. Never imports ``ray``."""
