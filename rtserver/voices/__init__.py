"""Voices: model adapters that turn a text segment into PCM chunks."""
