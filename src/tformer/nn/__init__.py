"""The model, in PyTorch: attention, feed-forward, layers, masks, positions, pooling, the
encoder, decoder, encoder-decoder and classifier, decoding, lower precisions. Mirrored file for
file by tformer.reference (NumPy)."""
