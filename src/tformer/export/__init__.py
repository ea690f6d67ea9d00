"""Writing other tools' formats from a model: transformers, sentence-transformers, ONNX,
torch.nn; model cards. Above the model."""
