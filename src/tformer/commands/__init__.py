"""Sub-commands of the `tformer` CLI, one module each (see tformer.commands.cli)."""
