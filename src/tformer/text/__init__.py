"""Text in, token ids out: tokenizers, special ids, padded batches, input lines (torch-free)."""
