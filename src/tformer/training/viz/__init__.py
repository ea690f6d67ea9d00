"""Pictures: attention maps, positional encodings, curves (matplotlib), and the attention page."""
