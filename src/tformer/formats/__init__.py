"""Reading model directories: BERT-format and sentence-transformers layouts, tformer's own
format, their key tables. Below the model: tformer.nn builds from what these read."""
