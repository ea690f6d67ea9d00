"""The special token ids every vocabulary tformer builds starts with.

Synthetic tasks and tokenizers trained on your data put the same four tokens first, so
padding masks (``ids != PAD``), the loss's ignore index and generation agree everywhere.
A pretrained directory's tokenizer brings its own ids ([PAD], [CLS], [SEP]).
"""

PAD, BOS, EOS, UNK = 0, 1, 2, 3
