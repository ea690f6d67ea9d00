"""Sub-commands of the `tformer` CLI, one module each (see tformer.cli)."""
