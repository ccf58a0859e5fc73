"""The nitro subcommands, one module per group; nitro.client.cli builds the parser and maps errors."""
