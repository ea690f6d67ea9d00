"""Sentence embeddings at corpus scale: the sentence encoder, the search index, resumable
embedding files."""
