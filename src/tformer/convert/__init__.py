"""Checkpoint formats as declarative key tables: torch.nn (torch_nn) and HuggingFace BERT (hf_bert)."""
